"""The gRPC edge shared by every service: the server interceptor, the one table from exceptions
to status codes, request decoding limits, the call log, reflection and the health service."""
