// Command release keeps the requirements between this repository's
// modules true outside the repository, where a user's build ignores the
// replace directives and go.work that make it build here.
//
// The modules that are released together are listed in modules.txt at the
// repository's root, one directory a line. Every requirement of one of
// them on another names one version, the same for all:
//
//	go run ./internal/release pin HEAD      # every requirement in the set at HEAD's pseudo-version
//	go run ./internal/release pin v0.4.0    # every requirement at a version to be tagged
//	go run ./internal/release check         # prove it: each module built and tested alone
//	go run ./internal/release tags v0.4.0   # the git tags that cut the release
//
// pin takes a version (vX.Y.Z) or any git revision (a commit, a branch,
// HEAD): a revision becomes each module's pseudo-version of that commit
// (v0.0.0-<UTC commit time>-<12 hex>, or after the module's newest tag
// reachable from it vX.Y.(Z+1)-0.<time>-<hex>). A commit cannot name
// itself, so the requirements name an earlier commit that has every
// package and name the modules use; check proves that it does.
//
// check builds a module proxy in a temporary directory (a file:// GOPROXY:
// <module>/@v/list, .info, .mod and .zip for every version of the
// repository's modules that the requirements reach, zipped from git at the
// commit each names), copies each module of the set out of the working
// tree on its own, drops its replace directives, adds the proxy's
// checksums to its go.sum, and runs go vet and go test on it with
// GOWORK=off and -mod=readonly. A requirement that names a root without a
// package the module imports fails there with "no required module
// provides package", as it would for a user. Arguments after "--" go to
// go test (check -- -race -run TestX); "check -vet" runs go vet alone, and
// "check -m store/postgres,examples" checks those modules only.
//
// It uses only the standard library, git and the go command.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

const usage = `usage:
	go run ./internal/release pin <version | git revision>
	go run ./internal/release check [-vet] [-keep] [-m dir,...] [-- go test flags]
	go run ./internal/release proxy <dir>
	go run ./internal/release tags <version>
	go run ./internal/release modules`

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("no command\n%s", usage)
	}
	repo, err := openRepo(".")
	if err != nil {
		return err
	}
	switch cmd, args := args[0], args[1:]; cmd {
	case "pin":
		if len(args) != 1 {
			return fmt.Errorf("pin takes one version or revision\n%s", usage)
		}
		return repo.pin(args[0])
	case "check":
		fs := flag.NewFlagSet("check", flag.ContinueOnError)
		vetOnly := fs.Bool("vet", false, "run go vet only, no tests")
		keep := fs.Bool("keep", false, "keep the temporary directory and print its name")
		only := fs.String("m", "", "check only these modules (directories, comma-separated)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		return repo.check(*vetOnly, *keep, *only, fs.Args())
	case "proxy":
		if len(args) != 1 {
			return fmt.Errorf("proxy takes the directory to write\n%s", usage)
		}
		_, err := repo.buildProxy(args[0])
		return err
	case "tags":
		if len(args) != 1 || !isSemver(args[0]) {
			return fmt.Errorf("tags takes one version vX.Y.Z\n%s", usage)
		}
		for _, m := range repo.set {
			fmt.Println(m.tag(args[0]))
		}
		return nil
	case "modules":
		for _, m := range repo.set {
			fmt.Printf("%s\t%s\n", m.Dir, m.Path)
		}
		return nil
	case "help", "-h", "-help", "--help":
		fmt.Println(usage)
		return nil
	default:
		return fmt.Errorf("unknown command %q\n%s", cmd, usage)
	}
}
