// Package headername checks the header names that the middleware, the
// client and the gateway take as options.
package headername

// Valid reports whether name can name a header field: an RFC 9110 token
// (letters, digits and !#$%&'*+-.^_`|~).
func Valid(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '!', c == '#', c == '$', c == '%', c == '&', c == '\'', c == '*',
			c == '+', c == '-', c == '.', c == '^', c == '_', c == '`', c == '|', c == '~':
		default:
			return false
		}
	}
	return true
}
