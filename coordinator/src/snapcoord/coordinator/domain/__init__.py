"""Pure domain logic: typed, no I/O, no grpc/kazoo/boto3 imports."""
