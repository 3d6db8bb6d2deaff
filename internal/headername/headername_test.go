package headername

import "testing"

func TestValid(t *testing.T) {
	for _, name := range []string{"Idempotency-Key", "x-key", "X_Key.1", "a!#$%&'*+-.^_`|~z"} {
		if !Valid(name) {
			t.Errorf("Valid(%q) = false", name)
		}
	}
	for _, name := range []string{"", "Idempotency Key", "key:", "k\x00", "clé", "(key)", "a/b"} {
		if Valid(name) {
			t.Errorf("Valid(%q) = true", name)
		}
	}
}
