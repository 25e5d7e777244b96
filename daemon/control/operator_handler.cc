// operator_handler.cc: placeholder, filled in by the issue 11 adapter work.
