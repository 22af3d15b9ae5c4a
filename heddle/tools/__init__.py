"""Tools: executables that take one JSON object on stdin and print one on stdout."""
