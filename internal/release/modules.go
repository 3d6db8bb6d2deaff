package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// setFile is the file, at the repository's root, that lists the modules
// released together.
const setFile = "modules.txt"

// module is one module of the set: its directory relative to the
// repository's root ("." for the root) and its module path.
type module struct {
	Dir  string
	Path string
}

// tag returns the git tag of version v of m: v for the root, <dir>/v for
// the others.
func (m module) tag(v string) string {
	if m.Dir == "." {
		return v
	}
	return m.Dir + "/" + v
}

// repo is the repository: its root directory, the root module's path and
// the set.
type repo struct {
	root     string // absolute
	rootPath string // the root module's path
	set      []module
}

// openRepo finds the repository around dir and reads the set, refusing a
// set that does not match the go.mod files in the working tree and go.work.
func openRepo(dir string) (*repo, error) {
	top, err := git(dir, "rev-parse", "--show-toplevel")
	if err != nil {
		return nil, err
	}
	r := &repo{root: strings.TrimSpace(string(top))}
	data, err := os.ReadFile(filepath.Join(r.root, setFile))
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		d := path.Clean(line)
		gm, err := readGoMod(filepath.Join(r.root, filepath.FromSlash(d), "go.mod"))
		if err != nil {
			return nil, fmt.Errorf("%s lists %s: %w", setFile, d, err)
		}
		r.set = append(r.set, module{Dir: d, Path: gm.Module.Path})
	}
	if len(r.set) == 0 || r.set[0].Dir != "." {
		return nil, fmt.Errorf("%s must list the root module (.) first", setFile)
	}
	r.rootPath = r.set[0].Path
	for _, m := range r.set[1:] {
		if want := r.rootPath + "/" + m.Dir; m.Path != want {
			return nil, fmt.Errorf("module %s in %s: path %s, want %s (the release tags and the proxy assume path = root + dir)", m.Dir, setFile, m.Path, want)
		}
	}
	return r, r.consistent()
}

// consistent reports a go.mod in the working tree that the set or go.work
// does not list, and a module of the set that go.work does not use.
func (r *repo) consistent() error {
	out, err := git(r.root, "ls-files", "-co", "--exclude-standard", "--", "go.mod", "**/go.mod")
	if err != nil {
		return err
	}
	var problems []string
	for _, f := range strings.Fields(string(out)) {
		if strings.Contains("/"+f, "/testdata/") {
			continue
		}
		if _, err := os.Stat(filepath.Join(r.root, f)); err != nil {
			continue // deleted, not yet committed
		}
		d := path.Dir(f)
		if !slices.ContainsFunc(r.set, func(m module) bool { return m.Dir == d }) {
			problems = append(problems, fmt.Sprintf("%s is not listed in %s", f, setFile))
		}
	}
	var work struct{ Use []struct{ DiskPath string } }
	if err := goJSON(r.root, &work, "work", "edit", "-json", filepath.Join(r.root, "go.work")); err != nil {
		return err
	}
	for _, m := range r.set {
		if !slices.ContainsFunc(work.Use, func(u struct{ DiskPath string }) bool { return path.Clean(u.DiskPath) == m.Dir }) {
			problems = append(problems, fmt.Sprintf("go.work does not use %s", m.Dir))
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// ours reports whether a module path is one of this repository's (the
// set's today, or one that an older commit had).
func (r *repo) ours(p string) bool {
	return p == r.rootPath || strings.HasPrefix(p, r.rootPath+"/")
}

// dirOf returns the directory of a module path of ours.
func (r *repo) dirOf(p string) string {
	if p == r.rootPath {
		return "."
	}
	return strings.TrimPrefix(p, r.rootPath+"/")
}

// goMod is what the release tool reads of a go.mod (go mod edit -json).
type goMod struct {
	Module  struct{ Path string }
	Require []struct {
		Path     string
		Version  string
		Indirect bool
	}
	Replace []struct {
		Old struct{ Path, Version string }
	}
}

// readGoMod parses the go.mod file at file.
func readGoMod(file string) (*goMod, error) {
	var gm goMod
	if err := goJSON(filepath.Dir(file), &gm, "mod", "edit", "-json", file); err != nil {
		return nil, err
	}
	return &gm, nil
}

// parseGoMod parses go.mod content (from git) through a temporary file.
func parseGoMod(data []byte) (*goMod, error) {
	dir, err := os.MkdirTemp("", "release-gomod-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	f := filepath.Join(dir, "go.mod")
	if err := os.WriteFile(f, data, 0o644); err != nil {
		return nil, err
	}
	return readGoMod(f)
}

// pin rewrites every requirement, in every module of the set, on another
// module of ours to target: a version, or the pseudo-version of a git
// revision (each module's own, after its own tags).
func (r *repo) pin(target string) error {
	version := func(m string) (string, error) { return target, nil }
	if !isSemver(target) || isPseudo(target) {
		full, err := git(r.root, "rev-parse", "--verify", target+"^{commit}")
		if err != nil {
			return fmt.Errorf("%s is neither a version vX.Y.Z nor a commit: %w", target, err)
		}
		commit := strings.TrimSpace(string(full))
		version = func(p string) (string, error) { return r.pseudoVersion(r.dirOf(p), commit) }
	}
	for _, m := range r.set {
		file := filepath.Join(r.root, filepath.FromSlash(m.Dir), "go.mod")
		gm, err := readGoMod(file)
		if err != nil {
			return err
		}
		var edits []string
		for _, req := range gm.Require {
			if !r.ours(req.Path) {
				continue
			}
			v, err := version(req.Path)
			if err != nil {
				return err
			}
			if v != req.Version {
				edits = append(edits, "-require="+req.Path+"@"+v)
			}
		}
		if len(edits) == 0 {
			continue
		}
		if _, err := command(filepath.Dir(file), nil, "go", append([]string{"mod", "edit"}, append(edits, file)...)...); err != nil {
			return err
		}
		fmt.Printf("%s: %d requirement(s) rewritten\n", m.Dir, len(edits))
	}
	return nil
}

// pseudoVersion returns the pseudo-version of commit for the module in dir:
// the tag itself if the commit is tagged for it, else one after the
// newest release tag of the module reachable from the commit, else
// v0.0.0-<time>-<hex>.
func (r *repo) pseudoVersion(dir, commit string) (string, error) {
	prefix := ""
	if dir != "." {
		prefix = dir + "/"
	}
	out, err := git(r.root, "tag", "--merged", commit, "--list", prefix+"v*")
	if err != nil {
		return "", err
	}
	var newest string
	for _, t := range strings.Fields(string(out)) {
		v := strings.TrimPrefix(t, prefix)
		if !isSemver(v) || isPseudo(v) || strings.Contains(v, "+") {
			continue
		}
		if newest == "" || semverCompare(v, newest) > 0 {
			newest = v
		}
	}
	if newest != "" {
		at, err := git(r.root, "rev-parse", "--verify", prefix+newest+"^{commit}")
		if err != nil {
			return "", err
		}
		if strings.TrimSpace(string(at)) == commit {
			return newest, nil
		}
	}
	info, err := git(r.root, "show", "-s", "--format=%ct", commit)
	if err != nil {
		return "", err
	}
	secs, err := strconv.ParseInt(strings.TrimSpace(string(info)), 10, 64)
	if err != nil {
		return "", err
	}
	stamp := time.Unix(secs, 0).UTC().Format("20060102150405") + "-" + commit[:12]
	switch {
	case newest == "":
		return "v0.0.0-" + stamp, nil
	case strings.Contains(newest, "-"): // a pre-release: vX.Y.Z-pre.0.<stamp>
		return newest + ".0." + stamp, nil
	default: // vX.Y.(Z+1)-0.<stamp>
		maj, min, patch := semverParts(newest)
		return fmt.Sprintf("v%d.%d.%d-0.%s", maj, min, patch+1, stamp), nil
	}
}

// commitOf returns the commit that version v of the module in dir names:
// a pseudo-version's revision, or the module's tag.
func (r *repo) commitOf(dir, v string) (string, error) {
	rev := module{Dir: dir}.tag(v)
	if isPseudo(v) {
		rev = v[strings.LastIndex(v, "-")+1:]
	}
	out, err := git(r.root, "rev-parse", "--verify", "--quiet", rev+"^{commit}")
	if err != nil {
		return "", fmt.Errorf("%s@%s: no commit %s in this repository's history (fetch it, or pin to a commit that is: go run ./internal/release pin HEAD)", dir, v, rev)
	}
	return strings.TrimSpace(string(out)), nil
}

// isSemver reports whether v looks like a semantic version vX.Y.Z[-pre][+build].
func isSemver(v string) bool {
	if !strings.HasPrefix(v, "v") {
		return false
	}
	core, _, _ := strings.Cut(v[1:], "+")
	core, _, _ = strings.Cut(core, "-")
	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return false
	}
	for _, p := range parts {
		if _, err := strconv.Atoi(p); err != nil || p == "" {
			return false
		}
	}
	return true
}

// isPseudo reports whether v is a pseudo-version (its last part a
// 14-digit time and 12 hex digits).
func isPseudo(v string) bool {
	if !isSemver(v) {
		return false
	}
	i := strings.LastIndex(v, "-")
	if i < 0 || len(v)-i-1 != 12 {
		return false
	}
	stamp := v[:i]
	j := strings.LastIndexAny(stamp, "-.")
	return j >= 0 && len(stamp)-j-1 == 14
}

// semverParts returns the major, minor and patch numbers of v.
func semverParts(v string) (int, int, int) {
	core, _, _ := strings.Cut(v[1:], "-")
	core, _, _ = strings.Cut(core, "+")
	p := strings.Split(core, ".")
	a, _ := strconv.Atoi(p[0])
	b, _ := strconv.Atoi(p[1])
	c, _ := strconv.Atoi(p[2])
	return a, b, c
}

// semverCompare orders two versions by their numbers, a release after its
// pre-releases, and pre-releases by their text.
func semverCompare(a, b string) int {
	a1, a2, a3 := semverParts(a)
	b1, b2, b3 := semverParts(b)
	for _, d := range []int{a1 - b1, a2 - b2, a3 - b3} {
		if d != 0 {
			return d
		}
	}
	_, pa, _ := strings.Cut(strings.SplitN(a, "+", 2)[0], "-")
	_, pb, _ := strings.Cut(strings.SplitN(b, "+", 2)[0], "-")
	switch {
	case pa == pb:
		return 0
	case pa == "":
		return 1
	case pb == "":
		return -1
	}
	return strings.Compare(pa, pb)
}

// git runs git in dir and returns its standard output.
func git(dir string, args ...string) ([]byte, error) {
	return command(dir, nil, "git", args...)
}

// goJSON runs the go command in dir and decodes its JSON output into v.
func goJSON(dir string, v any, args ...string) error {
	out, err := command(dir, []string{"GOWORK=off", "GOFLAGS=-mod=mod"}, "go", args...)
	if err != nil {
		return err
	}
	return json.Unmarshal(out, v)
}

// command runs name with args in dir, with env added to the environment,
// and returns its standard output; its standard error is in the error.
func command(dir string, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s (in %s): %w\n%s", name, strings.Join(args, " "), dir, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}
