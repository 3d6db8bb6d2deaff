package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// modVersion is one version of one of our modules.
type modVersion struct{ Path, Version string }

// proxy is a module proxy built from the repository's history, and the
// go.sum lines of everything it serves.
type proxy struct {
	dir  string
	sums []string
}

// buildProxy writes, under dir, a file:// module proxy that serves every
// version of our modules the set's requirements reach (the working tree's
// go.mod files, then the go.mod of each version served, at its commit).
func (r *repo) buildProxy(dir string) (*proxy, error) {
	var queue []modVersion
	for _, m := range r.set {
		gm, err := readGoMod(filepath.Join(r.root, filepath.FromSlash(m.Dir), "go.mod"))
		if err != nil {
			return nil, err
		}
		for _, req := range gm.Require {
			if r.ours(req.Path) {
				queue = append(queue, modVersion{req.Path, req.Version})
			}
		}
	}
	p := &proxy{dir: dir}
	seen := map[modVersion]bool{}
	versions := map[string][]string{}
	for len(queue) > 0 {
		mv := queue[0]
		queue = queue[1:]
		if seen[mv] {
			continue
		}
		seen[mv] = true
		gomod, err := r.serve(p, mv)
		if err != nil {
			return nil, err
		}
		versions[mv.Path] = append(versions[mv.Path], mv.Version)
		gm, err := parseGoMod(gomod)
		if err != nil {
			return nil, fmt.Errorf("%s@%s: go.mod: %w", mv.Path, mv.Version, err)
		}
		for _, req := range gm.Require {
			if r.ours(req.Path) {
				queue = append(queue, modVersion{req.Path, req.Version})
			}
		}
	}
	for p1, vs := range versions {
		sort.Strings(vs)
		list := filepath.Join(dir, filepath.FromSlash(p1), "@v", "list")
		if err := os.WriteFile(list, []byte(strings.Join(vs, "\n")+"\n"), 0o644); err != nil {
			return nil, err
		}
	}
	sort.Strings(p.sums)
	return p, nil
}

// serve writes mv's .info, .mod and .zip into the proxy from the commit mv
// names, and returns its go.mod.
func (r *repo) serve(p *proxy, mv modVersion) ([]byte, error) {
	dir := r.dirOf(mv.Path)
	commit, err := r.commitOf(dir, mv.Version)
	if err != nil {
		return nil, err
	}
	files, err := r.moduleFiles(commit, dir)
	if err != nil {
		return nil, fmt.Errorf("%s@%s: %w", mv.Path, mv.Version, err)
	}
	gomod, ok := files["go.mod"]
	if !ok {
		return nil, fmt.Errorf("%s@%s: commit %.12s has no %s/go.mod: the module did not exist yet (pin to a later commit: go run ./internal/release pin HEAD)", mv.Path, mv.Version, commit, dir)
	}
	when, err := git(r.root, "show", "-s", "--format=%cI", commit)
	if err != nil {
		return nil, err
	}
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(string(when)))
	if err != nil {
		return nil, err
	}
	base := filepath.Join(p.dir, filepath.FromSlash(mv.Path), "@v")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, err
	}
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{mv.Version, t.UTC()})
	if err := os.WriteFile(filepath.Join(base, mv.Version+".info"), info, 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(base, mv.Version+".mod"), gomod, 0o644); err != nil {
		return nil, err
	}
	zipped, sum, err := zipModule(mv, files)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(base, mv.Version+".zip"), zipped, 0o644); err != nil {
		return nil, err
	}
	p.sums = append(p.sums,
		fmt.Sprintf("%s %s %s", mv.Path, mv.Version, sum),
		fmt.Sprintf("%s %s/go.mod %s", mv.Path, mv.Version, hash1(map[string][]byte{"go.mod": gomod})))
	return gomod, nil
}

// moduleFiles returns the files of the module in dir at commit, by their
// paths relative to dir: every regular file under dir but those of a
// directory with a go.mod of its own (a nested module), as in the module
// zip the go command makes.
func (r *repo) moduleFiles(commit, dir string) (map[string][]byte, error) {
	args := []string{"archive", "--format=tar", commit}
	if dir != "." {
		args = append(args, "--", dir)
	}
	cmd := exec.Command("git", args...)
	cmd.Dir = r.root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if dir != "." && strings.Contains(stderr.String(), "did not match") {
			return map[string][]byte{}, nil
		}
		return nil, fmt.Errorf("git %s: %w\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	all := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		name := h.Name
		if dir != "." {
			name = strings.TrimPrefix(name, dir+"/")
		}
		all[name] = data
	}
	var nested []string
	for name := range all {
		if path.Base(name) == "go.mod" && name != "go.mod" {
			nested = append(nested, path.Dir(name)+"/")
		}
	}
	for name := range all {
		if slices.ContainsFunc(nested, func(n string) bool { return strings.HasPrefix(name, n) }) ||
			isVCSDir(name) {
			delete(all, name)
		}
	}
	return all, nil
}

// isVCSDir reports a file inside a version-control directory, which module
// zips leave out.
func isVCSDir(name string) bool {
	for _, elem := range strings.Split(path.Dir(name), "/") {
		switch elem {
		case ".git", ".hg", ".svn", ".bzr":
			return true
		}
	}
	return false
}

// zipModule makes mv's module zip (each file as <path>@<version>/<file>)
// and returns it with its go.sum hash.
func zipModule(mv modVersion, files map[string][]byte) ([]byte, string, error) {
	prefix := mv.Path + "@" + mv.Version + "/"
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	named := map[string][]byte{}
	for _, n := range names {
		w, err := zw.Create(prefix + n)
		if err != nil {
			return nil, "", err
		}
		if _, err := w.Write(files[n]); err != nil {
			return nil, "", err
		}
		named[prefix+n] = files[n]
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	return buf.Bytes(), hash1(named), nil
}

// hash1 is the go.sum hash "h1:" of a set of files by name: the SHA-256
// of the lines "<sha256 hex>  <name>\n" in the names' order, in base64.
func hash1(files map[string][]byte) string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%x  %s\n", sha256.Sum256(files[n]), n)
	}
	return "h1:" + base64.StdEncoding.EncodeToString(h.Sum(nil))
}
