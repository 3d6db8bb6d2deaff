// Package oldcanon is fingerprint.CanonicalJSON as it stood at 2fe902f,
// before the canonicaliser was tuned for speed, kept as the oracle of the
// differential tests (fingerprint's TestCanonicalMatchesOld and
// FuzzCanonicalMatchesOld): every canonical form, error and error offset
// the package gives must stay what this code gives, byte for byte, because
// a changed canonical form changes a stored request's fingerprint.
//
// Its files are fingerprint's json.go, jsonname.go and jsonstring.go of
// that commit with the package clause changed and CanonicalJSON taking a
// fresh state instead of a pooled one. Never change its behaviour; it is
// imported by tests only.
package oldcanon
