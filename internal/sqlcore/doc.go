// Package sqlcore is what idemkey's SQL stores (store/postgres,
// store/mysql) share, written once: the options every SQL store takes
// (Config), the claim's answer and what it means to the middleware
// (Found, Found.Result), the bounded retry of an owner-checked statement
// (Attempts, GaveUp), the block a kept response's headers are stored in
// (EncodeHeader, DecodeHeader), the names of a claim's locks (LockID,
// LockName), the background sweeper (Sweeper, SweepBatches) and the small
// helpers of their answers (Another, Micros). It imports only the
// standard library and the root module's store package: each store keeps
// its driver, its SQL and its error prefix.
package sqlcore
