"""Generated protobuf modules; regenerate with scripts/gen_protos.py, never edit."""
