package idemgrpc

import (
	"github.com/idemkey/idemkey/internal/retryhint"
)

// runTimes is the method's running estimate of how long a first run takes,
// which feeds the RetryInfo of an in-flight answer by the rule of
// package middleware's Retry-After (internal/retryhint).
func (s *Server) runTimes(method string) *retryhint.RunTimes {
	if t, ok := s.runs.Load(method); ok {
		return t.(*retryhint.RunTimes)
	}
	t, _ := s.runs.LoadOrStore(method, new(retryhint.RunTimes))
	return t.(*retryhint.RunTimes)
}
