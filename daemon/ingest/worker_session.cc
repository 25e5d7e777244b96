// worker_session.cc: placeholder, filled in by the issue 11 adapter work.
