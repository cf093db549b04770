"""gRPC definitions. ``protos.gen`` imports the generated modules, building them first if the
.proto changed (generated code lives in protos/_generated/, ignored by git)."""
