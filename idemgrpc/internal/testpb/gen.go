// Package testpb holds the messages and service the idemgrpc tests call,
// generated from payments.proto. The generated code is committed, so the
// tests need no generator; regenerate with go generate (protoc, and
// protoc-gen-go and protoc-gen-go-grpc at the versions of the module's
// google.golang.org/protobuf and google.golang.org/grpc requirements).
package testpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative payments.proto
