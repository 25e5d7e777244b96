// worker_session.h: placeholder, filled in by the issue 11 adapter work.
