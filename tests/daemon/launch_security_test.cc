// Two rules of docs/ARCHITECTURE.md, "Security model", against a real daemon:
// nothing sent over the wire is executed (commands come from daemon-side launch
// profiles whose parameters are validated), and checkpoints are confined to the
// run's checkpoint root, with rewinds and the launcher's {resume} naming only
// checkpoints whose file is still there with the registered checksum.
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/control/catalog_adapters.h"
#include "daemon/launch/checkpoint_guard.h"
#include "daemon/launch/launch_profiles.h"
#include "daemon/launch/local_launcher.h"
#include "gmock/gmock.h"
#include "storage/catalog/catalog.h"
#include "storage/checkpoint/checksum.h"
#include "storage/corpus/corpus_tools.h"
#include "tests/daemon/daemon_fixture.h"

namespace spikeguard::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream f(path);
  f << text;
}

class LaunchSecurityTest : public DaemonFixture {
 protected:
  void SetUp() override {
    root_ = dir_.File("ckpt");
    corpora_ = dir_.File("corpora");
    fs::create_directories(corpora_ + "/c1");
    Write(dir_.File("profiles.textproto"), Profiles());
    DaemonFixture::SetUp();
  }

  void ConfigureDaemon(daemon::Daemon::Options& options) override {
    options.launch_profiles_file = dir_.File("profiles.textproto");
  }

  std::string Profiles() const {
    return absl::StrCat(R"pb(
      profile {
        name: "lister"
        # First start: `timeout 1 sleep 5` crashes (124) after a second;
        # restarts: sleep refuses --resume=PATH and prints it to the log.
        argv: "/usr/bin/timeout" argv: "1" argv: "/bin/sleep" argv: "5"
        argv: "--resume={resume}"
        checkpoint_root: ")pb", root_, R"pb(/{run}"
        corpus_root: ")pb", corpora_, R"pb("
        max_world_size: 2
        max_restarts: 1
        param { name: "steps" int { min: 1 max: 1000 } default_value: "10" }
        param { name: "lr" float { min: 0 max: 1 } default_value: "0.1" }
        param { name: "tag" string { max_length: 8 } default_value: "x" }
        param { name: "scenario" enum { value: "data" value: "small" } default_value: "data" }
        param { name: "args" flags { allow: "steps" allow: "set" } default_value: "" }
      }
      profile {
        # External: workers started by torchrun or a scheduler; the profile
        # only confines the run's checkpoints.
        name: "external"
        checkpoint_root: ")pb", root_, R"pb(/{run}"
      }
      profile {
        name: "toucher"
        argv: "/usr/bin/touch" argv: ")pb", dir_.File("launched-"), R"pb({tag}-{rank}"
        checkpoint_root: ")pb", root_, R"pb(/{run}"
        param { name: "tag" string {} }
      }
    )pb");
  }

  grpc::Status Create(const std::string& name, const v1::RunSpec& spec, bool launch = false,
                      uint32_t world_size = 1) {
    grpc::ClientContext ctx;
    v1::CreateRunRequest req;
    req.set_name(name);
    req.set_world_size(world_size);
    *req.mutable_spec() = spec;
    req.set_launch(launch);
    v1::Run out;
    return supervisor_->CreateRun(&ctx, req, &out);
  }

  static v1::RunSpec Spec(const std::string& profile,
                          const std::map<std::string, std::string>& params = {}) {
    v1::RunSpec spec;
    spec.set_profile(profile);
    for (const auto& [k, v] : params) (*spec.mutable_params())[k] = v;
    return spec;
  }

  grpc::Status Register(const std::string& run, int64_t step, const std::string& uri,
                        const std::string& checksum = "", int64_t bytes = 0) {
    grpc::ClientContext ctx;
    v1::RegisterCheckpointRequest req;
    auto* c = req.mutable_checkpoint();
    c->set_run(run);
    c->set_step(step);
    c->set_data_position(step);
    c->set_uri(uri);
    c->set_checksum(checksum);
    c->set_bytes(bytes);
    c->set_complete(true);
    v1::Checkpoint out;
    return supervisor_->RegisterCheckpoint(&ctx, req, &out);
  }

  // A checkpoint file in the run's root, registered with its XXH64.
  grpc::Status RegisterFile(const std::string& run, int64_t step, std::string* path_out = nullptr) {
    const std::string path = absl::StrCat(root_, "/", run, "/step-", step);
    const std::string content = absl::StrCat("weights of step ", step);
    Write(path, content);
    if (path_out) *path_out = path;
    return Register(run, step, "file://" + path, storage::ChecksumHex(storage::Xxh64Of(content)),
                    static_cast<int64_t>(content.size()));
  }

  std::vector<v1::Checkpoint> Checkpoints(const std::string& run) {
    grpc::ClientContext ctx;
    v1::ListCheckpointsRequest req;
    req.set_run(run);
    v1::ListCheckpointsResponse out;
    EXPECT_TRUE(supervisor_->ListCheckpoints(&ctx, req, &out).ok());
    return {out.checkpoints().begin(), out.checkpoints().end()};
  }

  grpc::Status Rewind(const std::string& run, int64_t to_step) {
    grpc::ClientContext ctx;
    v1::RewindRequest req;
    req.set_run(run);
    req.set_to_step(to_step);
    v1::ActionResponse out;
    return supervisor_->Rewind(&ctx, req, &out);
  }

  grpc::Status SetProfile(const std::string& run, const std::string& profile,
                          const std::map<std::string, std::string>& params, v1::Run* out) {
    grpc::ClientContext ctx;
    v1::SetRunProfileRequest req;
    req.set_run(run);
    req.set_profile(profile);
    for (const auto& [k, v] : params) (*req.mutable_params())[k] = v;
    return supervisor_->SetRunProfile(&ctx, req, out);
  }

  std::string root_;
  std::string corpora_;
};

// --- Nothing from the wire is executed ---------------------------------------

TEST_F(LaunchSecurityTest, AFreeCommandIsRefusedAndNothingRuns) {
  const std::string pwned = dir_.File("pwned");
  v1::RunSpec spec;
  spec.add_command("/usr/bin/touch");
  spec.add_command(pwned);
  grpc::Status s = Create("evil", spec, /*launch=*/true);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("spec.command"));
  EXPECT_THAT(s.error_message(), HasSubstr("launch profiles"));
  // Not even with a profile named next to it.
  spec.set_profile("toucher");
  (*spec.mutable_params())["tag"] = "a";
  EXPECT_EQ(Create("evil2", spec, true).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  absl::SleepFor(absl::Milliseconds(600));
  EXPECT_FALSE(fs::exists(pwned));
  grpc::ClientContext ctx;
  v1::GetRunRequest get;
  get.set_name("evil");
  v1::Run run;
  EXPECT_EQ(supervisor_->GetRun(&ctx, get, &run).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(LaunchSecurityTest, EnvAndWorkdirFromTheWireAreRefused) {
  v1::RunSpec env = Spec("toucher", {{"tag", "a"}});
  (*env.mutable_env())["LD_PRELOAD"] = "/tmp/evil.so";
  grpc::Status s = Create("e", env, true);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("spec.env"));
  v1::RunSpec workdir = Spec("toucher", {{"tag", "a"}});
  workdir.set_workdir("/etc");
  s = Create("w", workdir, true);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("spec.workdir"));
}

TEST_F(LaunchSecurityTest, TheProfileCommandRunsWithItsValidatedParameters) {
  ASSERT_TRUE(Create("ok", Spec("toucher", {{"tag", "t1"}}), /*launch=*/true, 2).ok());
  for (int i = 0; i < 100 && !(fs::exists(dir_.File("launched-t1-0")) &&
                               fs::exists(dir_.File("launched-t1-1")));
       ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(fs::exists(dir_.File("launched-t1-0")));
  EXPECT_TRUE(fs::exists(dir_.File("launched-t1-1")));
}

TEST_F(LaunchSecurityTest, ParametersAreValidated) {
  struct Case {
    std::string profile;
    std::map<std::string, std::string> params;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"nope", {}, "spec.profile: no launch profile 'nope'"},
      {"toucher", {}, "spec.params['tag']: missing"},
      {"toucher", {{"tag", "a/../../x"}}, "spec.params['tag']"},
      {"toucher", {{"tag", "a;rm -rf"}}, "outside letters, digits"},
      {"toucher", {{"tag", "-rf"}}, "may not start with '-'"},
      {"toucher", {{"tag", ".."}}, "only dots"},
      {"toucher", {{"tag", "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmno"}},
       "at most 64"},
      {"toucher", {{"tag", "a"}, {"evil", "1"}}, "spec.params['evil']: profile 'toucher' declares no"},
      {"lister", {{"steps", "0"}}, "spec.params['steps']: 0 is out of range [1, 1000]"},
      {"lister", {{"steps", "12abc"}}, "is not an integer"},
      {"lister", {{"lr", "nan"}}, "not a finite number"},
      {"lister", {{"lr", "2.5"}}, "out of range"},
      {"lister", {{"tag", "123456789"}}, "9 bytes, at most 8"},
      {"lister", {{"scenario", "numerics"}}, "is not one of data, small"},
      {"lister", {{"args", "--steps=5 --checkpoint-dir=x"}}, "option '--checkpoint-dir' is not allowed"},
      {"lister", {{"args", "--set=a/b"}}, "outside letters, digits and _.:@,=+-"},
      {"lister", {{"args", "steps=5"}}, "is not --name=value"},
      {"lister", {{"args", "--steps=5\n--set=x"}}, "spec.params['args']"},
  };
  int i = 0;
  for (const Case& c : cases) {
    grpc::Status s = Create(absl::StrCat("p", i++), Spec(c.profile, c.params));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.want;
    EXPECT_THAT(s.error_message(), HasSubstr(c.want));
  }
  // A bounded, escaped echo of what was sent.
  grpc::Status s = Create("long", Spec("toucher", {{"tag", std::string(5000, 'x') + "\x01"}}));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(s.error_message().size(), 400u);
  // And the good ones are stored.
  EXPECT_TRUE(Create("good", Spec("lister", {{"steps", "600"}, {"lr", "0.5"}, {"tag", "a_b.c"},
                                             {"scenario", "small"},
                                             {"args", "--steps=600 --set=warmup_steps=330"}}))
                  .ok());
}

TEST_F(LaunchSecurityTest, WorldSizeOverTheProfileMaxIsRefused) {
  grpc::Status s = Create("big", Spec("lister"), false, 3);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("world_size: 3 is over the max_world_size 2"));
  EXPECT_TRUE(Create("fits", Spec("lister"), false, 2).ok());
}

TEST_F(LaunchSecurityTest, CorpusDirMustBeUnderTheProfilesCorpusRoot) {
  v1::RunSpec spec = Spec("lister");
  spec.mutable_manifest()->set_corpus_dir("/etc");
  grpc::Status s = Create("c1", spec);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("spec.manifest.corpus_dir"));
  spec.mutable_manifest()->set_corpus_dir(corpora_ + "/c1/../../..");
  EXPECT_EQ(Create("c2", spec).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Without a profile no corpus dir may be named at all.
  v1::RunSpec bare;
  bare.mutable_manifest()->set_corpus_dir(corpora_ + "/c1");
  EXPECT_EQ(Create("c3", bare).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  spec.mutable_manifest()->set_corpus_dir(corpora_ + "/c1");
  EXPECT_TRUE(Create("c4", spec).ok());
}

// The corpus dir was confined when the run was created only: replaced later
// by a symlink to a corpus outside the root, the manifest resolved (and the
// report previewed) the outside corpus. It is confined at every use now.
TEST_F(LaunchSecurityTest, ACorpusDirReplacedByASymlinkLeadingOutIsRefusedAtUse) {
  storage::SynthOptions synth;
  synth.global_batch_size = 4;
  synth.sequence_length = 16;
  synth.positions = 64;
  ASSERT_TRUE(storage::SynthesizeCorpus(corpora_ + "/mine", 7, {}, synth).ok());
  ASSERT_TRUE(storage::SynthesizeCorpus(dir_.File("outside"), 8, {}, synth).ok());
  v1::RunSpec spec = Spec("lister");
  spec.mutable_manifest()->set_corpus_dir(corpora_ + "/mine");
  ASSERT_TRUE(Create("swapped", spec).ok());
  auto resolve = [&](v1::ResolveManifestResponse* out) {
    grpc::ClientContext ctx;
    v1::ResolveManifestRequest req;
    req.set_run("swapped");
    req.set_from_step(0);
    req.set_to_step(1);
    return supervisor_->ResolveManifest(&ctx, req, out);
  };
  v1::ResolveManifestResponse before;
  grpc::Status s = resolve(&before);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(before.steps_size(), 2);

  fs::rename(corpora_ + "/mine", corpora_ + "/mine.orig");
  fs::create_directory_symlink(dir_.File("outside"), corpora_ + "/mine");
  v1::ResolveManifestResponse after;
  s = resolve(&after);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("corpus dir '" + corpora_ + "/mine'"));
  EXPECT_THAT(s.error_message(), HasSubstr("outside the corpus root"));
  EXPECT_EQ(after.steps_size(), 0);

  // Put back, it resolves as before: nothing was lost, the daemon is up.
  fs::remove(corpora_ + "/mine");
  fs::rename(corpora_ + "/mine.orig", corpora_ + "/mine");
  v1::ResolveManifestResponse again;
  s = resolve(&again);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(again.SerializeAsString(), before.SerializeAsString());
}

TEST_F(LaunchSecurityTest, ALegacyRunIsNotLaunchedUntilAnAdminMapsIt) {
  // A run stored before launch profiles, with a free command line.
  const int port = daemon_->port();
  daemon_->Shutdown(absl::Seconds(1));
  daemon_.reset();
  {
    storage::CatalogOptions o;
    o.path = dir_.File("catalog.db");
    auto catalog = storage::Catalog::Open(o);
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    v1::Run legacy;
    legacy.set_name("old");
    legacy.set_world_size(1);
    legacy.mutable_spec()->add_command("/usr/bin/touch");
    legacy.mutable_spec()->add_command(dir_.File("legacy-ran"));
    (*legacy.mutable_spec()->mutable_env())["X"] = "1";
    ASSERT_TRUE((*catalog)->CreateRun(legacy).ok());

    // The launcher refuses it, saying what to do.
    daemon::RunRegistry registry(Clock::Real());
    daemon::LaunchProfiles none;
    daemon::CheckpointGuard guard(catalog->get(), &none, dir_.path());
    daemon::LocalLauncher::Options lo;
    lo.data_dir = dir_.path();
    lo.profiles = &none;
    lo.checkpoints = &guard;
    daemon::LocalLauncher launcher(lo, catalog->get(), &registry, Clock::Real());
    absl::Status launched = launcher.Launch("old");
    EXPECT_EQ(launched.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(launched.message(), HasSubstr("spikectl runs set-profile old --profile=NAME"));
  }
  StartDaemon(port);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(fs::exists(dir_.File("legacy-ran")));

  v1::Run out;
  grpc::Status s = SetProfile("old", "nope", {}, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("profile: no launch profile 'nope'"));
  s = SetProfile("old", "toucher", {{"tag", "$(id)"}}, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("params['tag']"));
  EXPECT_EQ(SetProfile("ghost", "toucher", {{"tag", "a"}}, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
  s = SetProfile("old", "toucher", {{"tag", "mapped"}}, &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(out.spec().profile(), "toucher");
  EXPECT_EQ(out.spec().command_size(), 0);
  EXPECT_TRUE(out.spec().env().empty());
  EXPECT_EQ(out.spec().params().at("tag"), "mapped");
}

// --- Confined checkpoints ----------------------------------------------------

TEST_F(LaunchSecurityTest, CheckpointsOutsideTheRootAreRefusedAndNotStored) {
  ASSERT_TRUE(Create("r", Spec("lister")).ok());
  fs::create_directories(root_ + "/r");
  fs::create_symlink("/etc", root_ + "/r/escape");
  for (const std::string& uri :
       {std::string("file:///etc/passwd"), std::string("../../../../etc/shadow"),
        std::string("http://169.254.169.254/x"), std::string("s3://bucket/ckpt"),
        absl::StrCat(root_, "/r/../../../etc/passwd"), absl::StrCat("file://", root_, "/r/escape/passwd"),
        absl::StrCat("file://", root_, "/r/%2e%2e/%2e%2e/x"), std::string("file://evil.host/x"),
        absl::StrCat("file://", root_, "/other-run/x")}) {
    grpc::Status s = Register("r", 10, uri);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << uri;
    EXPECT_THAT(s.error_message(), HasSubstr("checkpoint.uri")) << uri;
  }
  EXPECT_TRUE(Checkpoints("r").empty());
  // Inside: a plain path or a file:// URI.
  EXPECT_TRUE(Register("r", 20, absl::StrCat(root_, "/r/step-20")).ok());
  EXPECT_TRUE(Register("r", 30, absl::StrCat("file://", root_, "/r/sub/step-30")).ok());
  EXPECT_EQ(Checkpoints("r").size(), 2u);
}

// The daemon %-decoded file:// URIs and the reference worker only stripped
// "file://": with a directory ROOT/r/a%2fb, "file://ROOT/r/a%2fb/../../x"
// was ROOT/r/x to the daemon's check and ROOT/r/a%2fb/../../x, outside the
// root, to the worker. Both read URIs through one parser now, which refuses
// an encoded separator and "." or ".." segments, and file://localhost/P is P.
TEST_F(LaunchSecurityTest, ACheckpointUriHasOneReading) {
  ASSERT_TRUE(Create("r", Spec("lister")).ok());
  fs::create_directories(root_ + "/r/a%2fb");
  fs::create_directories(root_ + "/r/x");
  std::ofstream(root_ + "/outside.bin") << "secret";
  for (const std::string& uri : {
           absl::StrCat("file://", root_, "/r/a%2fb/../../outside.bin"),
           absl::StrCat("file://", root_, "/r/a%2Fb/../../outside.bin"),
           absl::StrCat("file://", root_, "/r/x/../step-1"),
           absl::StrCat("file://", root_, "/r/./step-1"),
           absl::StrCat(root_, "/r/x/../step-1"),
           absl::StrCat("file://", root_, "/r/step-1?x"),
           absl::StrCat("file://", root_, "/r/step-1#x"),
           absl::StrCat("file://", root_, "/r/step-1;x"),
           absl::StrCat("file://remote", root_, "/r/step-1"),
       }) {
    grpc::Status s = Register("r", 10, uri);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << uri;
    EXPECT_THAT(s.error_message(), HasSubstr("checkpoint.uri")) << uri;
  }
  EXPECT_TRUE(Checkpoints("r").empty());
  // The same file in three spellings; an encoded byte of a real name is decoded.
  std::ofstream(root_ + "/r/step 20%") << "x";
  for (const std::string& uri : {absl::StrCat("file://localhost", root_, "/r/step%2020%25"),
                                 absl::StrCat("file://", root_, "/r/step%2020%25"),
                                 absl::StrCat(root_, "/r/step 20%")}) {
    auto path = daemon::CheckpointGuard::PathOfUri(uri);
    ASSERT_TRUE(path.ok()) << uri << ": " << path.status();
    EXPECT_EQ(*path, root_ + "/r/step 20%") << uri;
  }
  EXPECT_TRUE(Register("r", 20, absl::StrCat("file://localhost", root_, "/r/step%2020%25")).ok());
  EXPECT_EQ(Checkpoints("r").size(), 1u);
}

// With the run's root a symbolic link to "/", every path was inside it: a
// worker token registered /etc/shadow, and a rewind named /etc/passwd.
TEST_F(LaunchSecurityTest, ASymlinkedCheckpointRootConfinesNothingAndIsRefused) {
  ASSERT_TRUE(Create("s", Spec("lister")).ok());
  fs::create_directories(root_);
  fs::create_symlink("/", root_ + "/s");
  for (const std::string& uri : {std::string("file:///etc/passwd"), std::string("/etc/shadow"),
                                 absl::StrCat(root_, "/s/etc/passwd")}) {
    grpc::Status s = Register("s", 10, uri);
    EXPECT_FALSE(s.ok()) << uri;
    EXPECT_THAT(s.error_message(), HasSubstr("is a symbolic link")) << uri;
  }
  EXPECT_TRUE(Checkpoints("s").empty());
  // A real directory in its place confines again.
  fs::remove(root_ + "/s");
  fs::create_directories(root_ + "/s");
  EXPECT_FALSE(Register("s", 10, "file:///etc/passwd").ok());
  EXPECT_TRUE(Register("s", 10, absl::StrCat(root_, "/s/step-10")).ok());
}

TEST_F(LaunchSecurityTest, AnExternalProfileConfinesCheckpointsAndIsNeverLaunched) {
  // Created (spikectl asks to launch any run with a spec) and not launched:
  // it waits for workers started outside the daemon.
  ASSERT_TRUE(Create("torchrun2", Spec("external"), /*launch=*/true).ok());
  grpc::ClientContext ctx;
  v1::GetRunRequest get;
  get.set_name("torchrun2");
  v1::Run run;
  ASSERT_TRUE(supervisor_->GetRun(&ctx, get, &run).ok());
  EXPECT_EQ(run.state(), v1::RUN_CREATED);
  EXPECT_EQ(Register("torchrun2", 5, "file:///etc/passwd").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Register("torchrun2", 5, absl::StrCat(root_, "/torchrun2/step-5")).ok());
}

TEST_F(LaunchSecurityTest, ARunWithoutAProfileIsConfinedToItsDataDir) {
  ASSERT_TRUE(CreateRun("plain").ok());
  EXPECT_EQ(Register("plain", 1, "file:///etc/passwd").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Register("plain", 1, "file://" + dir_.File("runs/plain/ckpt/step-1")).ok());
}

TEST_F(LaunchSecurityTest, AWorkerStreamCheckpointOutsideTheRootIsAnsweredAndNotStored) {
  ASSERT_TRUE(Create("w", Spec("lister")).ok());
  auto a = Attach("w");
  ASSERT_TRUE(a.first.has_welcome()) << a.first.DebugString();
  v1::WorkerMessage msg;
  msg.mutable_checkpoint()->set_step(5);
  msg.mutable_checkpoint()->set_uri("file:///etc/passwd");
  msg.mutable_checkpoint()->set_complete(true);
  ASSERT_TRUE(a.stream->Write(msg));
  v1::ControllerMessage in;
  ASSERT_TRUE(a.stream->Read(&in));
  ASSERT_TRUE(in.has_ack()) << in.DebugString();
  EXPECT_EQ(in.ack().rejected(), 1);
  EXPECT_THAT(in.ack().message(), HasSubstr("outside the checkpoint root"));
  EXPECT_TRUE(Checkpoints("w").empty());
  a.ctx->TryCancel();
}

TEST_F(LaunchSecurityTest, AManualRewindNamesOnlyCheckpointsThatStillVerify) {
  ASSERT_TRUE(Create("m", Spec("lister")).ok());
  std::string p10, p20, p30;
  ASSERT_TRUE(RegisterFile("m", 10, &p10).ok());
  ASSERT_TRUE(RegisterFile("m", 20, &p20).ok());
  ASSERT_TRUE(RegisterFile("m", 30, &p30).ok());
  // Deleted.
  fs::remove(p30);
  grpc::Status s = Rewind("m", 30);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("cannot rewind to step 30"));
  EXPECT_THAT(s.error_message(), HasSubstr("No such file"));
  // Modified (same size, other bytes).
  Write(p20, "weights of step 2X");
  s = Rewind("m", 20);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("XXH64"));
  // Swapped for a symlink out of the root.
  fs::remove(p10);
  fs::create_symlink("/etc/passwd", p10);
  s = Rewind("m", 10);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("'" + p10 + "' is a symbolic link"));
  // Restored: the rewind goes out.
  fs::remove(p10);
  Write(p10, "weights of step 10");
  s = Rewind("m", 10);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// Inside the root, confinement went by the canonical path: a dangling
// symbolic link (the file itself, or a directory of its path) resolved to
// the link's own path, inside, and was registered; once its target appeared
// outside, the link led there. Nothing below the root is reached through a
// symbolic link now, wherever it leads, and the refusal names it.
TEST_F(LaunchSecurityTest, ASymlinkInsideTheRootIsRefusedNamingIt) {
  ASSERT_TRUE(Create("y", Spec("lister")).ok());
  const std::string run_root = root_ + "/y";
  const std::string outside = dir_.File("outside");
  fs::create_directories(run_root + "/real");
  fs::create_directories(outside);
  Write(outside + "/secret", "secret");
  Write(run_root + "/real/step-1", "weights");
  fs::create_symlink(outside + "/later", run_root + "/step-5");        // dangling, the file
  fs::create_symlink(outside + "/later-dir", run_root + "/g1");        // dangling, a directory
  fs::create_symlink(outside + "/secret", run_root + "/step-6");       // the file, leading out
  fs::create_symlink(outside, run_root + "/g2");                       // a directory, leading out
  fs::create_symlink(run_root + "/real", run_root + "/g3");            // a directory, leading in
  const std::vector<std::pair<std::string, std::string>> refused = {
      {run_root + "/step-5", run_root + "/step-5"},
      {run_root + "/g1/step-5", run_root + "/g1"},
      {run_root + "/step-6", run_root + "/step-6"},
      {run_root + "/g2/secret", run_root + "/g2"},
      {run_root + "/g3/step-1", run_root + "/g3"},
  };
  for (const auto& [path, link] : refused) {
    for (const std::string& uri : {path, "file://" + path}) {
      grpc::Status s = Register("y", 5, uri);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << uri;
      EXPECT_THAT(s.error_message(), HasSubstr("checkpoint.uri")) << uri;
      EXPECT_THAT(s.error_message(), HasSubstr("'" + link + "' is a symbolic link")) << uri;
    }
  }
  EXPECT_TRUE(Checkpoints("y").empty());
  // The real directory, and a path not written yet, register.
  EXPECT_TRUE(Register("y", 1, "file://" + run_root + "/real/step-1").ok());
  EXPECT_TRUE(Register("y", 2, "file://" + run_root + "/real/later/step-2").ok());
  EXPECT_EQ(Checkpoints("y").size(), 2u);
}

// A checkpoint registered in a real directory; the directory is then moved
// out of the root and a symbolic link to it put in its place (the file, its
// size and checksum unchanged). The rewind refuses it, naming the link.
TEST_F(LaunchSecurityTest, ADirectorySwappedForASymlinkAfterRegistrationIsRefusedAtRewind) {
  ASSERT_TRUE(Create("t", Spec("lister")).ok());
  const std::string dir = root_ + "/t/g0";
  const std::string content = "weights of step 10";
  Write(dir + "/step-10", content);
  ASSERT_TRUE(Register("t", 10, "file://" + dir + "/step-10",
                       storage::ChecksumHex(storage::Xxh64Of(content)),
                       static_cast<int64_t>(content.size()))
                  .ok());
  ASSERT_TRUE(Rewind("t", 10).ok());
  const std::string moved = dir_.File("moved-out");
  fs::rename(dir, moved);
  fs::create_symlink(moved, dir);
  grpc::Status s = Rewind("t", 10);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("cannot rewind to step 10"));
  EXPECT_THAT(s.error_message(), HasSubstr("'" + dir + "' is a symbolic link"));
  // Back in place: usable again.
  fs::remove(dir);
  fs::rename(moved, dir);
  EXPECT_TRUE(Rewind("t", 10).ok());
}

// Bytes this process has read (read, pread: files and sockets alike).
int64_t BytesRead() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return -1;
}

// A rewind hashed the whole checkpoint on the daemon's decision path before
// the command went out: 19 s for a 6 GiB file. The file registered is now
// known by its identity (inode, size, times) and only its head is read; the
// worker checks the checksum as it loads it. Here a 2 GiB sparse file
// (registered with the sha256 of its 2 GiB of zeros): the rewind reads
// almost nothing of it.
TEST_F(LaunchSecurityTest, ARewindToALargeSparseCheckpointDoesNotReadItWhole) {
  ASSERT_TRUE(Create("big", Spec("lister")).ok());
  const std::string path = root_ + "/big/step-100.bin";
  constexpr int64_t kSize = int64_t{2} << 30;
  fs::create_directories(root_ + "/big");
  {
    std::ofstream(path).close();
    ASSERT_EQ(truncate(path.c_str(), kSize), 0);
  }
  // sha256 of 2^31 zero bytes.
  const std::string sha256 = "a7c744c13cc101ed66c29f672f92455547889cc586ce6d44fe76ae824958ea51";
  ASSERT_TRUE(Register("big", 100, "file://" + path, sha256, kSize).ok());
  const int64_t before = BytesRead();
  const absl::Time start = absl::Now();
  grpc::Status s = Rewind("big", 100);
  const absl::Duration took = absl::Now() - start;
  const int64_t read = BytesRead() - before;
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::cout << "rewind to a 2 GiB sparse checkpoint: " << absl::ToDoubleMilliseconds(took)
            << " ms, " << read << " bytes read by the daemon\n";
  EXPECT_LT(read, int64_t{16} << 20);
}

// A file changed after registration, even with its size and modification
// time put back, is refused at the rewind, which names the checkpoint.
// Before, the result of the last verification was cached by device, inode,
// size and modification time, so such an edit after one rewind was not seen
// by the next; the change time, which cannot be set back, is part of the
// file's identity now.
TEST_F(LaunchSecurityTest, ACheckpointAlteredAfterRegistrationIsRefusedAtRewind) {
  ASSERT_TRUE(Create("alt", Spec("lister")).ok());
  std::string p10, p20;
  ASSERT_TRUE(RegisterFile("alt", 10, &p10).ok());
  ASSERT_TRUE(RegisterFile("alt", 20, &p20).ok());
  ASSERT_TRUE(Rewind("alt", 20).ok());
  struct stat st {};
  ASSERT_EQ(stat(p20.c_str(), &st), 0);
  {
    std::fstream f(p20, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f << "W";  // same size, one byte other
  }
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(utimensat(AT_FDCWD, p20.c_str(), times, 0), 0);
  grpc::Status s = Rewind("alt", 20);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(),
              HasSubstr("cannot rewind to step 20: the checkpoint at step 20 ('file://" + p20));
  EXPECT_THAT(s.error_message(), HasSubstr("XXH64"));
  // Grown: refused by its size.
  std::ofstream(p10, std::ios::app) << "more";
  s = Rewind("alt", 10);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("the checkpoint at step 10"));
  EXPECT_THAT(s.error_message(), HasSubstr("it was registered with 18"));
  // Registered before it was written: read whole at the first rewind, and
  // then known by its identity; the same edit is refused after that too.
  ASSERT_TRUE(Create("alt2", Spec("lister")).ok());
  const std::string p30 = root_ + "/alt2/step-30";
  const std::string content = "weights of step 30";
  ASSERT_TRUE(Register("alt2", 30, "file://" + p30,
                       storage::ChecksumHex(storage::Xxh64Of(content)),
                       static_cast<int64_t>(content.size()))
                  .ok());
  Write(p30, content);
  s = Rewind("alt2", 30);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(stat(p30.c_str(), &st), 0);
  {
    std::fstream f(p30, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f << "W";
  }
  const struct timespec times30[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(utimensat(AT_FDCWD, p30.c_str(), times30, 0), 0);
  s = Rewind("alt2", 30);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("the checkpoint at step 30"));
  EXPECT_THAT(s.error_message(), HasSubstr("XXH64"));
}

TEST_F(LaunchSecurityTest, TheLauncherResumesOnlyFromAVerifiedCheckpoint) {
  // Launched: the first start crashes after a second; its restart gets
  // --resume={resume}.
  ASSERT_TRUE(Create("l", Spec("lister"), /*launch=*/true).ok());
  std::string p10, p20, p25, p30;
  ASSERT_TRUE(RegisterFile("l", 10, &p10).ok());
  ASSERT_TRUE(RegisterFile("l", 20, &p20).ok());
  ASSERT_TRUE(RegisterFile("l", 25, &p25).ok());
  ASSERT_TRUE(RegisterFile("l", 30, &p30).ok());
  EXPECT_EQ(Register("l", 40, "file:///etc/passwd").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  fs::remove(p30);                           // deleted
  Write(p25, "weights of step 2X");          // modified
  fs::remove(p20);
  fs::create_symlink("/etc/passwd", p20);    // pointing out of the root
  const std::string log = dir_.File("runs/l/rank-0.log");
  for (int i = 0; i < 100 && Slurp(log).find("--resume") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  const std::string text = Slurp(log);
  EXPECT_THAT(text, HasSubstr("--resume=" + fs::weakly_canonical(p10).string()));
  EXPECT_THAT(text, Not(HasSubstr("/etc/passwd")));
  EXPECT_THAT(text, Not(HasSubstr("step-20")));
  EXPECT_THAT(text, Not(HasSubstr("step-25")));
  EXPECT_THAT(text, Not(HasSubstr("step-30")));
  // The profile's max_restarts (1): the restarted rank fails again and the
  // run is failed, not restarted a second time.
  v1::Run run;
  for (int i = 0; i < 100 && run.state() != v1::RUN_FAILED; ++i) {
    grpc::ClientContext ctx;
    v1::GetRunRequest get;
    get.set_name("l");
    ASSERT_TRUE(supervisor_->GetRun(&ctx, get, &run).ok());
    if (run.state() != v1::RUN_FAILED) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(run.state(), v1::RUN_FAILED);
  // Why, for whoever finds it failed: on record before the state said so.
  {
    grpc::ClientContext ctx;
    v1::ListAuditRequest req;
    req.set_run("l");
    v1::ListAuditResponse audit;
    ASSERT_TRUE(supervisor_->ListAudit(&ctx, req, &audit).ok());
    std::string failed;
    for (const v1::AuditEntry& e : audit.entries()) {
      if (e.rpc() == "run-failed") failed += e.detail();
    }
    EXPECT_THAT(failed, HasSubstr("rank 0 exited with code "));
    EXPECT_THAT(failed, HasSubstr("out of restarts (1 of 1 spent)"));
  }
  absl::SleepFor(absl::Milliseconds(500));
  size_t starts = 0;
  for (size_t at = 0; (at = Slurp(log).find("unrecognized option", at)) != std::string::npos; ++at) {
    ++starts;
  }
  EXPECT_EQ(starts, 1u);
}

// The engine chooses its rewinds from CatalogRunView::Checkpoints: with the
// guard set, a checkpoint stored before the upgrade outside the root, one
// whose file is gone, one modified and one swapped for a symlink out are
// left out; the good one stays.
TEST(CatalogRunViewTest, TheEngineSeesOnlyCheckpointsThatVerify) {
  TempDir dir;
  storage::CatalogOptions o;
  o.path = dir.File("catalog.db");
  auto catalog = storage::Catalog::Open(o);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  v1::Run run;
  run.set_name("r");
  run.set_world_size(1);
  ASSERT_TRUE((*catalog)->CreateRun(run).ok());
  const std::string root = dir.File("runs/r");
  auto add = [&](int64_t step, const std::string& uri, const std::string& content) {
    v1::Checkpoint c;
    c.set_run("r");
    c.set_step(step);
    c.set_uri(uri);
    c.set_complete(true);
    c.set_checksum(storage::ChecksumHex(storage::Xxh64Of(content)));
    ASSERT_TRUE((*catalog)->UpsertCheckpoint(c).ok());
  };
  for (int step : {10, 20, 30, 40}) {
    Write(absl::StrCat(root, "/step-", step), absl::StrCat("weights ", step));
    add(step, absl::StrCat("file://", root, "/step-", step), absl::StrCat("weights ", step));
  }
  add(50, "file:///etc/passwd", "x");                       // stored before the upgrade
  fs::remove(absl::StrCat(root, "/step-20"));                // gone
  Write(absl::StrCat(root, "/step-30"), "weights 3X");       // modified
  fs::remove(absl::StrCat(root, "/step-40"));
  fs::create_symlink("/etc/hostname", absl::StrCat(root, "/step-40"));  // out of the root
  daemon::CheckpointGuard guard(catalog->get(), nullptr, dir.path());
  daemon::CatalogRunView unguarded(catalog->get());
  ASSERT_EQ(unguarded.Checkpoints("r")->size(), 5u);
  daemon::CatalogRunView view(catalog->get(), &guard);
  auto seen = view.Checkpoints("r");
  ASSERT_TRUE(seen.ok());
  ASSERT_EQ(seen->size(), 1u);
  EXPECT_EQ((*seen)[0].step, 10);
}

// The check and the open were two lookups of one path string: a directory
// swapped for a symbolic link in between sent the open (and the size and
// checksum checks, whose errors quote what they found) to a file outside the
// root. Here a thread swaps a directory of the checkpoint's path with a link
// to a directory outside, as fast as it can, while the guard verifies; the
// file outside has another size, so an error quoting its size shows that it
// was opened. Opened from the root's descriptor without following links,
// each verification sees the real directory (and accepts) or the link (and
// refuses it, naming it), never the file outside.
TEST(CheckpointGuardTest, AVerificationNeverOpensThroughADirectorySwappedMidCheck) {
  TempDir dir;
  storage::CatalogOptions o;
  o.path = dir.File("catalog.db");
  auto catalog = storage::Catalog::Open(o);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  v1::Run run;
  run.set_name("r");
  run.set_world_size(1);
  ASSERT_TRUE((*catalog)->CreateRun(run).ok());
  const std::string root = dir.File("runs/r");
  const std::string content = "weights of step 10";
  Write(root + "/g0/step-10", content);
  Write(dir.File("outside/step-10"), "a file outside, of another size");
  fs::create_symlink(dir.File("outside"), root + "/swap");
  v1::Checkpoint c;
  c.set_run("r");
  c.set_step(10);
  c.set_uri("file://" + root + "/g0/step-10");
  c.set_bytes(static_cast<int64_t>(content.size()));
  c.set_checksum(storage::ChecksumHex(storage::Xxh64Of(content)));
  c.set_complete(true);
  daemon::CheckpointGuard guard(catalog->get(), nullptr, dir.path());
  ASSERT_TRUE(guard.Verify(c).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> swaps{0};
  std::thread swapper([&] {
    const std::string a = root + "/g0", b = root + "/swap";
    while (!stop.load()) {
      if (renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) ++swaps;
    }
  });
  const std::string outside_size =
      absl::StrCat("has ", fs::file_size(dir.File("outside/step-10")), " bytes");
  int accepted = 0, refused = 0;
  std::vector<std::string> opened_outside, other;
  const absl::Time end = absl::Now() + absl::Seconds(4);
  while (absl::Now() < end) {
    absl::StatusOr<std::string> v = guard.Verify(c);
    if (v.ok()) {
      ++accepted;
      continue;
    }
    ++refused;
    const std::string m(v.status().message());
    if (m.find(outside_size) != std::string::npos) {
      opened_outside.push_back(m);
    } else if (m.find("'" + root + "/g0' is a symbolic link") == std::string::npos) {
      other.push_back(m);
    }
  }
  stop = true;
  swapper.join();
  EXPECT_GT(swaps.load(), 1000);
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
  EXPECT_TRUE(opened_outside.empty())
      << opened_outside.size() << " of " << accepted + refused
      << " verifications opened the file outside the root, e.g.: " << opened_outside.front();
  EXPECT_TRUE(other.empty()) << other.size() << " of " << accepted + refused
                             << " verifications refused without naming the link, e.g.: "
                             << other.front();
}

// --- The profile file itself -------------------------------------------------

TEST(LaunchProfilesTest, BuildKeepsEachFlagOneArgumentAndPassesOnlyAllowedEnv) {
  setenv("SG_TEST_ALLOWED", "yes", 1);
  setenv("SG_TEST_SECRET", "no", 1);
  auto profiles = daemon::LaunchProfiles::FromText(R"pb(
    profile {
      name: "w"
      argv: "/bin/worker" argv: "--run={run}" argv: "--resume" argv: "{resume}"
      argv: "--config=/conf/{scenario}.conf" argv: "{args}" argv: "--data={data}"
      env_allow: "SG_TEST_ALLOWED"
      env { key: "FIXED" value: "1" }
      workdir: "/tmp"
      checkpoint_root: "/tmp/ck/{run}"
      max_restarts: 4
      param { name: "scenario" enum { value: "data" } }
      param { name: "args" flags { allow: "steps" allow: "poison" } default_value: "" }
      param { name: "data" path { root: "/tmp" } default_value: "/tmp" }
    }
  )pb");
  ASSERT_TRUE(profiles.ok()) << profiles.status();
  v1::RunSpec spec;
  spec.set_profile("w");
  (*spec.mutable_params())["scenario"] = "data";
  (*spec.mutable_params())["args"] = "--steps=600  --poison=junk@599";
  (*spec.mutable_params())["data"] = "/tmp/a/../b";
  auto cmd = (*profiles)->Build("r1", spec, 1, {{"resume", ""}});
  ASSERT_TRUE(cmd.ok()) << cmd.status();
  EXPECT_THAT(cmd->argv, ::testing::ElementsAre("/bin/worker", "--run=r1", "--config=/conf/data.conf",
                                                "--steps=600", "--poison=junk@599",
                                                "--data=" + fs::weakly_canonical("/tmp/b").string()));
  EXPECT_EQ(cmd->env.count("SG_TEST_SECRET"), 0u);
  EXPECT_EQ(cmd->env.at("SG_TEST_ALLOWED"), "yes");
  EXPECT_EQ(cmd->env.at("FIXED"), "1");
  EXPECT_EQ(cmd->workdir, "/tmp");
  EXPECT_EQ(cmd->max_restarts, 4);
  (*spec.mutable_params())["data"] = "/etc/passwd";
  EXPECT_EQ((*profiles)->Build("r1", spec, 1, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto root = (*profiles)->CheckpointRoot("r1", spec);
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(**root, "/tmp/ck/r1");
}

TEST(LaunchProfilesTest, BadProfileFilesAreRefused) {
  for (const char* text : {
           R"pb(profile { name: "a" argv: "worker" checkpoint_root: "/c" })pb",
           R"pb(profile { name: "a" argv: "/bin/{x}" checkpoint_root: "/c" })pb",
           R"pb(profile { name: "a" argv: "/bin/w" argv: "{unknown}" checkpoint_root: "/c" })pb",
           R"pb(profile { name: "a" argv: "/bin/w" })pb",
           R"pb(profile { name: "a" argv: "/bin/w" argv: "--x={f}" checkpoint_root: "/c"
                          param { name: "f" flags {} } })pb",
           R"pb(profile { name: "a" argv: "/bin/w" checkpoint_root: "/c"
                          param { name: "n" int { min: 1 max: 3 } default_value: "9" } })pb",
           R"pb(profile { name: "a" argv: "/bin/w" checkpoint_root: "/c" }
                profile { name: "a" argv: "/bin/w" checkpoint_root: "/c" })pb",
       }) {
    EXPECT_FALSE(daemon::LaunchProfiles::FromText(text).ok()) << text;
  }
}

TEST(LaunchProfilesTest, AnEditedFileAppliesWithoutARestart) {
  TempDir dir;
  const std::string path = dir.File("p.textproto");
  Write(path, R"pb(profile { name: "a" argv: "/bin/true" checkpoint_root: "/c" })pb");
  auto profiles = daemon::LaunchProfiles::Load(path);
  ASSERT_TRUE(profiles.ok()) << profiles.status();
  EXPECT_FALSE((*profiles)->Find("b").ok());
  absl::SleepFor(absl::Milliseconds(20));
  Write(path, R"pb(profile { name: "b" argv: "/bin/true" checkpoint_root: "/c" })pb");
  EXPECT_TRUE((*profiles)->Find("b").ok());
  EXPECT_FALSE((*profiles)->Find("a").ok());
  // A broken edit keeps the previous profiles.
  Write(path, "profile { name: ");
  EXPECT_TRUE((*profiles)->Find("b").ok());
}

TEST(CheckpointGuardTest, UriForms) {
  using G = daemon::CheckpointGuard;
  EXPECT_EQ(*G::PathOfUri("file:///a/b%20c"), "/a/b c");
  EXPECT_EQ(*G::PathOfUri("file://localhost/a"), "/a");
  EXPECT_EQ(*G::PathOfUri("/a/b"), "/a/b");
  EXPECT_FALSE(G::PathOfUri("file://host/a").ok());
  EXPECT_FALSE(G::PathOfUri("a/b").ok());
  EXPECT_FALSE(G::PathOfUri("gs://b/x").ok());
  EXPECT_FALSE(G::PathOfUri("file:///a%00b").ok());
  EXPECT_FALSE(G::PathOfUri("file:///a%zz").ok());
  EXPECT_FALSE(G::PathOfUri("file:///a%2fb").ok());
  EXPECT_FALSE(G::PathOfUri("file:///a/%2e%2e/b").ok());
  EXPECT_FALSE(G::PathOfUri("file:///a/b?c").ok());
  EXPECT_EQ(*G::PathOfUri("file:///a%3Fb%23c"), "/a?b#c");
  EXPECT_EQ(*G::PathOfUri("file://LOCALHOST/a"), "/a");
  EXPECT_EQ(*G::PathOfUri("/a/b%2fc"), "/a/b%2fc");  // a plain path is literal
  EXPECT_THAT(G::PathOfUri("file://host/a").status().message(), HasSubstr("host 'host'"));
}

}  // namespace
}  // namespace spikeguard::testing
