package option

import (
	"errors"
	"strings"
	"testing"
)

type config struct{ n int }

type opt func(*config) error

func set(n int) opt {
	return func(c *config) error {
		if n < 0 {
			return errors.New("negative")
		}
		c.n = n
		return nil
	}
}

func TestApply(t *testing.T) {
	var c config
	if err := Apply("p", &c, []opt{set(1), set(2)}); err != nil || c.n != 2 {
		t.Fatalf("valid options: n=%d err=%v; want 2, nil (the later option wins)", c.n, err)
	}
	err := Apply("p", &c, []opt{set(-1), nil, set(3), set(-2)})
	if err == nil {
		t.Fatal("invalid options: no error")
	}
	msg := err.Error()
	for _, want := range []string{"p: negative", "p: option 2 is nil"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if strings.Count(msg, "negative") != 2 {
		t.Errorf("error %q: want both invalid values reported", msg)
	}
	if c.n != 3 {
		t.Errorf("valid options among invalid ones: n=%d, want 3", c.n)
	}
}
