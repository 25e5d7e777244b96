// spikeguard-slurm-exec: the interpreter of the batch scripts the Slurm
// launcher submits (daemon/launch/slurm_script.h). No shell is involved.
//
//   spikeguard-slurm-exec SCRIPT
//       (Slurm runs the script: its #! line names this program) reads the
//       script and executes  srun OPTIONS -- spikeguard-slurm-exec --task PORT -- ARGV
//   spikeguard-slurm-exec --task PORT -- ARGV...
//       (on every task) fills {rank} {local_rank} {world_size} from Slurm's
//       environment, sets RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
//       MASTER_ADDR MASTER_PORT, and executes ARGV.
// Exit status 2 with a message naming what was wrong when it cannot.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/subprocess.h"
#include "daemon/launch/slurm_script.h"

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "spikeguard-slurm-exec: %s\n", message.c_str());
  return 2;
}

int Exec(const std::vector<std::string>& argv) {
  return Fail(std::string(spikeguard::ExecProcess(argv).message()));
}

int TaskMode(int argc, char** argv) {
  // --task PORT -- ARGV...
  int port = 0;
  if (argc < 5 || std::string(argv[3]) != "--" || !absl::SimpleAtoi(argv[2], &port)) {
    return Fail("usage: spikeguard-slurm-exec --task PORT -- ARGV...");
  }
  auto task = spikeguard::daemon::SlurmTaskFromEnv([](const char* n) { return std::getenv(n); });
  if (!task.ok()) return Fail(std::string(task.status().message()));
  std::vector<std::string> command(argv + 4, argv + argc);
  command = spikeguard::daemon::ExpandTaskArgv(command, *task);
  setenv("RANK", absl::StrCat(task->rank).c_str(), 1);
  setenv("WORLD_SIZE", absl::StrCat(task->world_size).c_str(), 1);
  setenv("LOCAL_RANK", absl::StrCat(task->local_rank).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", absl::StrCat(task->local_world_size).c_str(), 1);
  setenv("MASTER_ADDR", task->master_addr.c_str(), 1);
  setenv("MASTER_PORT", absl::StrCat(port).c_str(), 1);
  return Exec(command);
}

int BatchMode(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Fail(absl::StrCat("cannot read the batch script ", path));
  std::stringstream text;
  text << in.rdbuf();
  auto script = spikeguard::daemon::ParseSlurmScript(text.str());
  if (!script.ok()) return Fail(std::string(script.status().message()));
  std::vector<std::string> argv = {script->srun};
  for (const auto& o : script->srun_options) argv.push_back(o);
  argv.push_back("--");
  argv.push_back(script->exec_path);
  argv.push_back("--task");
  argv.push_back(absl::StrCat(script->master_port));
  argv.push_back("--");
  for (const auto& a : script->argv) argv.push_back(a);
  return Exec(argv);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--task") return TaskMode(argc, argv);
  if (argc == 2 && argv[1][0] != '-') return BatchMode(argv[1]);
  return Fail("usage: spikeguard-slurm-exec SCRIPT | --task PORT -- ARGV...");
}
