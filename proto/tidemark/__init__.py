"""Generated gRPC code for the Tidemark API (package tidemark.v1), built by make."""
