module github.com/idemkey/idemkey/openapi

go 1.26.0

require (
	github.com/go-chi/chi/v5 v5.5.0
	github.com/idemkey/idemkey v0.0.0-20261203201705-bb524189222e
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.3
)

require (
	github.com/google/uuid v1.6.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)

// Until the root is tagged, build against the root in this repository.
replace github.com/idemkey/idemkey => ..
