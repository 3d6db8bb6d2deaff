package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// write writes files (path: content) under dir.
func write(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// commit commits everything in dir and returns the commit's hash.
func commit(t *testing.T, dir, msg string) string {
	t.Helper()
	for _, args := range [][]string{{"add", "-A"}, {"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", msg}} {
		if out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	out, err := git(dir, "rev-parse", "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// In a repository of two modules, a nested module that uses a package
// its required root does not have fails check, as it would for a user
// (the replace directive that makes it build in the workspace does not
// count), and pin to a commit that has it is the fix.
func TestCheckProvesRequirements(t *testing.T) {
	for _, bin := range []string{"git", "go"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s: %v", bin, err)
		}
	}
	dir := t.TempDir()
	if out, err := exec.Command("git", "init", "-q", dir).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	write(t, dir, map[string]string{
		"modules.txt": "# the set\n.\nsub\n",
		"go.mod":      "module example.com/r\n\ngo 1.26.0\n",
		"go.work":     "go 1.26.0\n\nuse (\n\t.\n\t./sub\n)\n",
		"a/a.go":      "package a\n\n// A is a.\nconst A = 1\n",
		"sub/go.mod":  "module example.com/r/sub\n\ngo 1.26.0\n\nrequire example.com/r v0.0.0-00010101000000-000000000000\n\nreplace example.com/r => ../\n",
		"sub/sub.go":  "package sub\n\nimport \"example.com/r/a\"\n\n// N is a.A.\nconst N = a.A\n",
	})
	c1 := commit(t, dir, "one")
	r, err := openRepo(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.pin(c1); err != nil {
		t.Fatal(err)
	}
	gm, err := readGoMod(filepath.Join(dir, "sub", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := r.pseudoVersion(".", c1)
	if err != nil {
		t.Fatal(err)
	}
	if len(gm.Require) != 1 || gm.Require[0].Version != want || !strings.HasSuffix(want, "-"+c1[:12]) || !isPseudo(want) {
		t.Fatalf("after pin %s: %+v, want %s", c1[:12], gm.Require, want)
	}
	commit(t, dir, "pin one")
	if err := r.check(false, false, "", nil); err != nil {
		t.Fatalf("check with the root at the commit that has package a: %v", err)
	}

	// The root gains package b and sub uses it, its requirement unchanged.
	write(t, dir, map[string]string{
		"b/b.go":     "package b\n\n// B is b.\nconst B = 2\n",
		"sub/sub.go": "package sub\n\nimport (\n\t\"example.com/r/a\"\n\t\"example.com/r/b\"\n)\n\n// N is a.A + b.B.\nconst N = a.A + b.B\n",
	})
	c3 := commit(t, dir, "b")
	if out, err := exec.Command("go", "-C", filepath.Join(dir, "sub"), "vet", "./...").CombinedOutput(); err != nil {
		t.Fatalf("in the workspace sub builds: %v\n%s", err, out)
	}
	err = r.check(true, false, "", nil)
	if err == nil || !strings.Contains(err.Error(), "sub: go vet") {
		t.Fatalf("check with the root at a commit without package b: %v, want sub to fail", err)
	}
	if err := r.pin(c3); err != nil {
		t.Fatal(err)
	}
	if err := r.check(true, false, "", nil); err != nil {
		t.Fatalf("check after pin %s: %v", c3[:12], err)
	}
}

// A module in the working tree that modules.txt does not list is refused.
func TestUnlistedModuleRefused(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("git", "init", "-q", dir).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	write(t, dir, map[string]string{
		"modules.txt":  ".\n",
		"go.mod":       "module example.com/r\n\ngo 1.26.0\n",
		"go.work":      "go 1.26.0\n\nuse .\n",
		"extra/go.mod": "module example.com/r/extra\n\ngo 1.26.0\n",
	})
	if _, err := openRepo(dir); err == nil || !strings.Contains(err.Error(), "extra/go.mod is not listed") {
		t.Errorf("openRepo: %v, want extra/go.mod refused", err)
	}
}

func TestVersions(t *testing.T) {
	for v, pseudo := range map[string]bool{
		"v0.0.0-20261201134112-96e04b4d74af":        true,
		"v0.4.1-0.20261201134112-96e04b4d74af":      true,
		"v0.4.0-rc.1.0.20261201134112-96e04b4d74af": true,
		"v0.4.0":     false,
		"v0.4.0-rc1": false,
	} {
		if !isSemver(v) || isPseudo(v) != pseudo {
			t.Errorf("%s: semver %v, pseudo %v; want true, %v", v, isSemver(v), isPseudo(v), pseudo)
		}
	}
	for _, c := range [][2]string{{"v0.4.0", "v0.3.9"}, {"v1.0.0", "v1.0.0-rc.1"}, {"v0.10.0", "v0.9.0"}} {
		if semverCompare(c[0], c[1]) <= 0 || semverCompare(c[1], c[0]) >= 0 {
			t.Errorf("%s should sort after %s", c[0], c[1])
		}
	}
}
