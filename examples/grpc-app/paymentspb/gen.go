// Package paymentspb holds the messages and service of examples/grpc-app,
// generated from payments.proto by protoc with protoc-gen-go and
// protoc-gen-go-grpc (at the versions of the module's requirements). The
// generated code is committed; regenerate with go generate.
package paymentspb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative payments.proto
