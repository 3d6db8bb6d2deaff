module github.com/idemkey/idemkey/metrics/otel

go 1.26.0

require (
	github.com/idemkey/idemkey v0.0.0-20261203201705-bb524189222e
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/metric v1.47.0
	go.opentelemetry.io/otel/trace v1.47.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
)

// Until the root is tagged, build against the root in this repository.
replace github.com/idemkey/idemkey => ../..
