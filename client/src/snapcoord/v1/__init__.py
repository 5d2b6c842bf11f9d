"""Generated protobuf and gRPC modules for the snapcoord.v1 API (do not edit: run scripts/gen-proto)."""
