package test

import "github.com/idemkey/idemkey/idemgrpc/internal/grpctest"

// The service under test and the helpers idemgrpc's own tests use, from
// internal/grpctest, under the names they have there.
type payments = grpctest.Payments

var (
	newServer = grpctest.NewServer
	newClient = grpctest.NewClient
	newMemory = grpctest.NewMemory
	serveTCP  = grpctest.ServeTCP
	dialTCP   = grpctest.Dial
	newKey    = grpctest.NewKey
	timeout   = grpctest.Timeout
)
