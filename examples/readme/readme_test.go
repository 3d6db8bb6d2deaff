// Package readme checks that the Go snippets of the repository's README
// compile, so that a rename cannot leave them stale.
//
// Each ```go block becomes a package of its own, in a temporary directory
// of this module (which requires every package the README shows), wrapped
// as follows, and the packages are built with go vet:
//
//   - import lines of the snippet are kept; the other imports are added
//     from the names the file uses (idem for middleware, goredis for
//     go-redis, chimw and echomw for chi's and echo's middleware, the
//     stores and adapters by their package names);
//   - a func declaration at the start of a line, through the next line
//     that is "}", stays a declaration of the package; every other line is
//     a statement of one function, snippet(); a line that is only "..."
//     (the README's "and so on") is dropped;
//   - the names the README leaves to the reader are declared by the
//     package unless the snippet declares them: ctx, auth, createPayment,
//     updateProfile, mw, id, amount, req, addrs, and r (a chi router); auth
//     and the handlers
//     take the shape of the framework the snippet uses (net/http, gin or
//     echo);
//   - a variable the snippet declares and leaves unused gets "_ = name".
package readme

import (
	"bytes"
	"errors"
	"fmt"
	"go/scanner"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// imports maps the package names the README uses to import paths.
var imports = map[string]string{
	"context":  `"context"`,
	"sql":      `"database/sql"`,
	"http":     `"net/http"`,
	"log":      `"log"`,
	"os":       `"os"`,
	"time":     `"time"`,
	"chi":      `"github.com/go-chi/chi/v5"`,
	"chimw":    `chimw "github.com/go-chi/chi/v5/middleware"`,
	"gin":      `"github.com/gin-gonic/gin"`,
	"echo":     `"github.com/labstack/echo/v4"`,
	"echomw":   `echomw "github.com/labstack/echo/v4/middleware"`,
	"goredis":  `goredis "github.com/redis/go-redis/v9"`,
	"pgxpool":  `"github.com/jackc/pgx/v5/pgxpool"`,
	"idem":     `idem "github.com/idemkey/idemkey/middleware"`,
	"idemkey":  `"github.com/idemkey/idemkey"`,
	"memory":   `"github.com/idemkey/idemkey/store/memory"`,
	"redis":    `"github.com/idemkey/idemkey/store/redis"`,
	"postgres": `"github.com/idemkey/idemkey/store/postgres"`,
	"mysql":    `"github.com/idemkey/idemkey/store/mysql"`,
	"client":   `"github.com/idemkey/idemkey/client"`,
	"gateway":  `"github.com/idemkey/idemkey/gateway"`,
	"scope":    `"github.com/idemkey/idemkey/scope"`,
	"idemgin":  `"github.com/idemkey/idemkey/idemgin"`,
	"idemecho": `"github.com/idemkey/idemkey/idemecho"`,
}

// given are the declarations of the names the README leaves to the
// reader, by the framework a snippet uses.
func given(framework string) map[string]string {
	handler := "func %s(w http.ResponseWriter, r *http.Request) {}"
	auth := "func auth(next http.Handler) http.Handler { return next }"
	switch framework {
	case "gin":
		handler = "func %s(c *gin.Context) {}"
		auth = "func auth(c *gin.Context) {}"
	case "echo":
		handler = "func %s(c echo.Context) error { return nil }"
		auth = "func auth(next echo.HandlerFunc) echo.HandlerFunc { return next }"
	}
	return map[string]string{
		"ctx":           "var ctx = context.Background()",
		"auth":          auth,
		"createPayment": fmt.Sprintf(handler, "createPayment"),
		"updateProfile": fmt.Sprintf(handler, "updateProfile"),
		"mw":            "var mw *idem.Middleware",
		"id":            `var id = "pay_1"`,
		"amount":        "var amount = 10",
		"req":           "var req *http.Request",
		"addrs":         "var addrs []string",
		"r":             "var r = chi.NewRouter()",
	}
}

// snippets returns the ```go blocks of a Markdown file, with the line each
// starts on.
func snippets(md []byte) (blocks []string, lines []int) {
	var cur *strings.Builder
	for i, line := range strings.Split(string(md), "\n") {
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur = &strings.Builder{}
			lines = append(lines, i+2)
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, cur.String())
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		}
	}
	return blocks, lines
}

var (
	topFunc  = regexp.MustCompile(`^func (\w+)\(`)
	usesName = func(name string) *regexp.Regexp { return regexp.MustCompile(`\b` + name + `\b`) }
	unused   = regexp.MustCompile(`snippet\.go:(\d+):\d+: (?:declared and not used: (\w+)|(\w+) declared and not used)`)
)

// wrap makes the Go file of one snippet (see the package comment).
func wrap(snippet string) string {
	var decls, body, imps []string
	inFunc := false
	declared := map[string]bool{}
	for _, line := range strings.Split(strings.TrimRight(snippet, "\n"), "\n") {
		switch {
		case strings.TrimSpace(line) == "...":
		case inFunc:
			decls = append(decls, line)
			inFunc = line != "}"
		case strings.HasPrefix(line, "import "):
			imp, _, _ := strings.Cut(strings.TrimPrefix(line, "import "), "//")
			imps = append(imps, strings.TrimSpace(imp))
		case topFunc.MatchString(line):
			declared[topFunc.FindStringSubmatch(line)[1]] = true
			decls = append(decls, line)
			inFunc = !strings.HasSuffix(line, "}")
		default:
			body = append(body, "\t"+line)
		}
	}
	framework := "http"
	switch {
	case strings.Contains(snippet, "gin."):
		framework = "gin"
	case strings.Contains(snippet, "echo."):
		framework = "echo"
	}
	var stubs []string
	for name, decl := range given(framework) {
		if !declared[name] && usesName(name).MatchString(snippet) {
			stubs = append(stubs, decl)
		}
	}
	slices.Sort(stubs)
	code := strings.Join(decls, "\n") + "\n\nfunc snippet() {\n" + strings.Join(body, "\n") + "\n}\n\n" + strings.Join(stubs, "\n") + "\n"
	qualifiers := qualifiers(code)
	for name, path := range imports {
		quoted := path[strings.Index(path, `"`):]
		if qualifiers[name] && !slices.ContainsFunc(imps, func(i string) bool { return strings.HasSuffix(i, quoted) }) {
			imps = append(imps, path)
		}
	}
	slices.Sort(imps)
	return "// Code generated from README.md by examples/readme; DO NOT EDIT.\n\npackage snippet\n\nimport (\n\t" + strings.Join(imps, "\n\t") + "\n)\n\n" + code
}

// qualifiers returns the identifiers that code uses before a ".", outside
// comments and strings: the package names it may need to import.
func qualifiers(code string) map[string]bool {
	fset := token.NewFileSet()
	var sc scanner.Scanner
	sc.Init(fset.AddFile("", fset.Base(), len(code)), []byte(code), nil, 0)
	found := map[string]bool{}
	prev := ""
	for {
		_, tok, lit := sc.Scan()
		if tok == token.EOF {
			return found
		}
		if tok == token.PERIOD && prev != "" {
			found[prev] = true
		}
		prev = ""
		if tok == token.IDENT {
			prev = lit
		}
	}
}

// TestREADMESnippetsCompile builds every Go snippet of the README.
func TestREADMESnippetsCompile(t *testing.T) {
	md, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("README.md is not beside this module (built outside the repository)")
	}
	if err != nil {
		t.Fatal(err)
	}
	blocks, lines := snippets(md)
	if len(blocks) < 10 {
		t.Fatalf("found %d Go snippets in README.md, want at least 10", len(blocks))
	}
	dir, err := os.MkdirTemp(".", "snippets-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	files := make([]string, len(blocks))
	for i, b := range blocks {
		files[i] = filepath.Join(dir, fmt.Sprintf("s%02d", i+1), "snippet.go")
		if err := os.MkdirAll(filepath.Dir(files[i]), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(files[i], []byte(wrap(b)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Build; a variable a snippet leaves unused gets "_ =" after its
	// line, and the build runs again.
	for attempt := 0; ; attempt++ {
		cmd := exec.Command("go", "vet", "./"+filepath.Base(dir)+"/...")
		out, err := cmd.CombinedOutput()
		if err == nil {
			return
		}
		fixed := false
		for _, f := range files {
			rel := filepath.ToSlash(f)
			for _, line := range bytes.Split(out, []byte("\n")) {
				if !bytes.Contains(line, []byte(strings.TrimPrefix(rel, "./"))) {
					continue
				}
				m := unused.FindSubmatch(line)
				if m == nil {
					continue
				}
				name := string(m[2]) + string(m[3])
				n, _ := strconv.Atoi(string(m[1]))
				src, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				ls := strings.Split(string(src), "\n")
				ls = slices.Insert(ls, n, "\t_ = "+name)
				if err := os.WriteFile(f, []byte(strings.Join(ls, "\n")), 0o644); err != nil {
					t.Fatal(err)
				}
				fixed = true
				break // line numbers moved: one fix per file per build
			}
		}
		if !fixed || attempt > 10 {
			for i, f := range files {
				if bytes.Contains(out, []byte(filepath.Base(filepath.Dir(f))+"/")) {
					src, _ := os.ReadFile(f)
					t.Errorf("README.md's Go snippet at line %d does not compile (wrapped as the package comment says):\n%s", lines[i], src)
				}
			}
			t.Fatalf("go vet:\n%s", out)
		}
	}
}
