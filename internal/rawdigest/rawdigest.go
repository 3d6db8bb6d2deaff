// Package rawdigest carries package fingerprint's raw digest of a request
// to the middleware, without making it part of fingerprint's API: the
// middleware keeps it in records (store.Record.RawDigest) and its local
// replay cache, so that a byte-identical repeat is known without its
// canonical form.
//
// Package fingerprint sets Of when it is initialised; package middleware
// imports fingerprint, so Of is set before the middleware reads it.
package rawdigest

import "net/http"

// Of returns a SHA-256 over everything fingerprint.Default reads of r and
// body, as the request has it, without canonicalising anything. Equal raw
// digests imply equal Default fingerprints; the converse does not hold.
var Of func(r *http.Request, body []byte) [32]byte
