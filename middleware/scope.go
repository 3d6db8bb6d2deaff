package middleware

import "net/http"

// scopeOf returns the scope of r, as the scope function (WithScope) names
// it. A scope function that returns "" has failed to name the caller: a
// signed-in caller it does not recognise would otherwise land in some
// namespace of others (the anonymous one, where "" used to go), and see
// their kept responses or be refused with their keys. So "" is an error:
// scopeOf reports EventScopeMissing, answers 500 scope_missing, and
// returns false; the request runs no handler and touches no store.
func (m *Middleware) scopeOf(w http.ResponseWriter, r *http.Request) (string, bool) {
	if sc := m.cfg.scope(r); sc != "" {
		return sc, true
	}
	m.refuse(w, r, Event{Kind: EventScopeMissing}, problemScopeMissing, 0)
	return "", false
}
