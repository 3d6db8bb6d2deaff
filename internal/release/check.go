package main

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// check proves that every module of the set builds, passes go vet and
// (unless vetOnly) its tests on its own, with its requirements as a user's
// build sees them: GOWORK=off, no replace directives, our modules from a
// proxy made from the history. testArgs go to go test; only, if not
// empty, names the modules to check (comma-separated directories).
func (r *repo) check(vetOnly, keep bool, only string, testArgs []string) error {
	// One directory per repository, the same from run to run, so that the
	// build cache (whose keys include a main module's directory) serves
	// the second run.
	id := sha256.Sum256([]byte(r.root))
	tmp := filepath.Join(os.TempDir(), fmt.Sprintf("idemkey-release-check-%x", id[:6]))
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if keep {
		fmt.Println("release: working in", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	if err := r.sameVersion(); err != nil {
		return err
	}
	p, err := r.buildProxy(filepath.Join(tmp, "proxy"))
	if err != nil {
		return err
	}
	upstream, err := command(r.root, nil, "go", "env", "GOPROXY", "GOFLAGS")
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(upstream)), "\n")
	goproxy := "file://" + filepath.ToSlash(p.dir)
	if len(lines) > 0 && lines[0] != "" && lines[0] != "off" {
		goproxy += "," + lines[0]
	}
	goflags := "-mod=readonly"
	if len(lines) > 1 && strings.TrimSpace(lines[1]) != "" {
		goflags = strings.TrimSpace(lines[1]) + " " + goflags
	}
	env := []string{
		"GOWORK=off",
		"GOPROXY=" + goproxy,
		"GONOSUMDB=" + r.rootPath,
		"GONOSUMCHECK=1",
		"GOFLAGS=" + goflags,
	}
	var failed []string
	for i, m := range r.set {
		if only != "" && !slices.Contains(strings.Split(only, ","), m.Dir) {
			continue
		}
		dir := filepath.Join(tmp, "m", fmt.Sprint(i))
		gm, err := r.copyModule(m, dir, p)
		if err != nil {
			return err
		}
		uses := slices.ContainsFunc(gm.Require, func(q struct {
			Path     string
			Version  string
			Indirect bool
		}) bool {
			return r.ours(q.Path)
		})
		steps := [][]string{{"go", "vet", "./..."}}
		if !vetOnly && uses {
			// A module that requires none of ours builds here as it does in the
			// workspace; its tests run there.
			steps = append(steps, append([]string{"go", "test", "-count=1"}, append(testArgs, "./...")...))
		}
		for _, s := range steps {
			start := time.Now()
			cmd := exec.Command(s[0], s[1:]...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), env...)
			out, err := cmd.CombinedOutput()
			status := "ok"
			if err != nil {
				status = "FAIL"
				failed = append(failed, m.Dir+": "+strings.Join(s, " "))
			}
			fmt.Printf("release: %-4s %-16s %s (%.1fs)\n", status, m.Dir, strings.Join(s[:2], " "), time.Since(start).Seconds())
			if err != nil {
				os.Stdout.Write(out)
				break
			}
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("outside the workspace, with the requirements as they are:\n\t%s\n"+
			"if a module uses what its requirements do not have, name a commit that has it:\n"+
			"\tgo run ./internal/release pin HEAD && git commit -am 'modules: require each other at HEAD'",
			strings.Join(failed, "\n\t"))
	}
	return nil
}

// sameVersion refuses requirements between our modules that name
// different versions of one module: the set moves together.
func (r *repo) sameVersion() error {
	named := map[string]map[string][]string{} // path -> version -> requirers
	for _, m := range r.set {
		gm, err := readGoMod(filepath.Join(r.root, filepath.FromSlash(m.Dir), "go.mod"))
		if err != nil {
			return err
		}
		for _, q := range gm.Require {
			if !r.ours(q.Path) {
				continue
			}
			if named[q.Path] == nil {
				named[q.Path] = map[string][]string{}
			}
			named[q.Path][q.Version] = append(named[q.Path][q.Version], m.Dir)
		}
	}
	var problems []string
	for p, vs := range named {
		if len(vs) > 1 {
			problems = append(problems, fmt.Sprintf("%s is required at %d versions: %v", p, len(vs), vs))
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return errors.New(strings.Join(problems, "\n") + "\n(go run ./internal/release pin <commit> names one)")
	}
	return nil
}

// copyModule copies m from the working tree (the files git tracks or
// would, without a nested module's) into dir, drops its replace directives
// of our modules and adds the proxy's checksums to its go.sum.
func (r *repo) copyModule(m module, dir string, p *proxy) (*goMod, error) {
	args := []string{"ls-files", "-co", "--exclude-standard"}
	if m.Dir != "." {
		args = append(args, "--", m.Dir)
	}
	out, err := git(r.root, args...)
	if err != nil {
		return nil, err
	}
	var nested []string
	for _, o := range r.set {
		if o.Dir != m.Dir && (m.Dir == "." || strings.HasPrefix(o.Dir, m.Dir+"/")) {
			nested = append(nested, o.Dir+"/")
		}
	}
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f == "" || slices.ContainsFunc(nested, func(n string) bool { return strings.HasPrefix(f, n) }) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(r.root, filepath.FromSlash(f)))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		rel := f
		if m.Dir != "." {
			rel = strings.TrimPrefix(f, m.Dir+"/")
		}
		to := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return nil, err
		}
		info, err := os.Stat(filepath.Join(r.root, filepath.FromSlash(f)))
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(to, data, info.Mode().Perm()); err != nil {
			return nil, err
		}
	}
	gomod := filepath.Join(dir, "go.mod")
	gm, err := readGoMod(gomod)
	if err != nil {
		return nil, err
	}
	var drops []string
	for _, rep := range gm.Replace {
		if r.ours(rep.Old.Path) {
			drops = append(drops, "-dropreplace="+rep.Old.Path)
		}
	}
	if len(drops) > 0 {
		if _, err := command(dir, nil, "go", append([]string{"mod", "edit"}, append(drops, gomod)...)...); err != nil {
			return nil, err
		}
	}
	sum, err := os.OpenFile(filepath.Join(dir, "go.sum"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	_, err = sum.WriteString(strings.Join(p.sums, "\n") + "\n")
	if cerr := sum.Close(); err == nil {
		err = cerr
	}
	return gm, err
}
