// Command cpubench runs Go benchmarks one at a time (each sub-benchmark on
// its own) in test binaries and
// adds the CPU time each operation cost, from the operating system's
// account of the benchmark process (user plus system time, every thread,
// the garbage collector included), as a "cpu-ns/op" metric next to the
// benchmark's own ns/op, B/op and allocs/op.
//
// On a machine shared with other work, ns/op (wall time) swings with the
// load; CPU time per operation barely moves, so it is what to compare.
// Each benchmark runs a fixed number of iterations (-n), and once more with
// a single iteration to subtract the process's start-up cost. Several
// binaries (a baseline and a change) are run in turns, round after round,
// so that a change in the machine's load falls on both alike.
//
// Usage:
//
//	go test -c -o old.test ./middleware   # on the baseline
//	go test -c -o new.test ./middleware   # on the change
//	go run ./cmd/cpubench -bench 'Bare|FirstRun|Replay$' -n 20000 -count 10 -o /tmp/ab old=old.test new=new.test
//	benchstat /tmp/ab/old.txt /tmp/ab/new.txt
//
// It writes one file per binary, NAME.txt in -o, in the format benchstat
// reads.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	bench := flag.String("bench", ".", "benchmarks to run, a regular expression over top-level benchmark names")
	n := flag.Int("n", 20000, "iterations per run")
	count := flag.Int("count", 10, "rounds; each round runs every benchmark of every binary once")
	out := flag.String("o", ".", "directory for the NAME.txt files")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: cpubench [flags] NAME=TEST-BINARY...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	log.SetFlags(0)
	if flag.NArg() == 0 || *n < 2 || *count < 1 {
		flag.Usage()
		os.Exit(2)
	}
	type binary struct {
		name, path string
		names      []string
		w          *bufio.Writer
	}
	var bins []*binary
	for _, arg := range flag.Args() {
		name, path, ok := strings.Cut(arg, "=")
		if !ok || name == "" || path == "" {
			log.Fatalf("cpubench: %q is not NAME=TEST-BINARY", arg)
		}
		path, err := filepath.Abs(path)
		if err != nil {
			log.Fatal(err)
		}
		names, err := list(path, *bench)
		if err != nil {
			log.Fatalf("cpubench: %s: %v", path, err)
		}
		f, err := os.Create(filepath.Join(*out, name+".txt"))
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		w := bufio.NewWriter(f)
		defer w.Flush()
		bins = append(bins, &binary{name: name, path: path, names: names, w: w})
	}
	for round := 1; round <= *count; round++ {
		for _, b := range bins {
			for i, name := range b.names {
				pattern := namePattern(name)
				base, err := run(b.path, pattern, 1)
				if err != nil {
					log.Fatalf("cpubench: %s %s: %v", b.name, name, err)
				}
				full, err := run(b.path, pattern, *n)
				if err != nil {
					log.Fatalf("cpubench: %s %s: %v", b.name, name, err)
				}
				if round == 1 && i == 0 {
					b.w.WriteString(full.header)
				}
				cpu := float64(full.cpu-base.cpu) / float64(*n-1)
				for _, line := range full.lines {
					line = fmt.Sprintf("%s\t%.0f cpu-ns/op", line, cpu)
					fmt.Fprintf(os.Stderr, "%-4s %s\n", b.name, line)
					fmt.Fprintln(b.w, line)
				}
			}
			b.w.Flush()
		}
	}
}

// list returns the names of the benchmarks in the binary at path whose
// top-level names match pattern: each leaf, so that a benchmark with
// sub-benchmarks is run one sub-benchmark at a time.
func list(path, pattern string) ([]string, error) {
	out, err := exec.Command(path, "-test.list", pattern).Output()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, top := range strings.Fields(string(out)) {
		if !strings.HasPrefix(top, "Benchmark") {
			continue
		}
		// One iteration of each shows the leaves' names.
		r, err := run(path, namePattern(top), 1)
		if err != nil {
			return nil, err
		}
		for _, line := range r.lines {
			name := strings.Fields(line)[0]
			if p := os.Getenv("GOMAXPROCS"); p != "" {
				name = strings.TrimSuffix(name, "-"+p)
			} else {
				name = strings.TrimSuffix(name, "-"+strconv.Itoa(runtime.NumCPU()))
			}
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no benchmarks match %q", pattern)
	}
	return names, nil
}

// namePattern returns the -test.bench pattern that matches name exactly,
// one anchored element per sub-benchmark level.
func namePattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

type result struct {
	header string        // the goos, goarch, pkg and cpu lines
	lines  []string      // the benchmark lines
	cpu    time.Duration // user plus system time of the process
}

// run runs the benchmarks matching pattern for n iterations each.
func run(path, pattern string, n int) (result, error) {
	cmd := exec.Command(path, "-test.run", "^$", "-test.bench", pattern, "-test.benchmem",
		fmt.Sprintf("-test.benchtime=%dx", n), "-test.count=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return result{}, fmt.Errorf("%v\n%s%s", err, stdout.Bytes(), stderr.Bytes())
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	r := result{cpu: cpu}
	for _, l := range strings.Split(stdout.String(), "\n") {
		switch {
		case strings.HasPrefix(l, "goos:"), strings.HasPrefix(l, "goarch:"), strings.HasPrefix(l, "pkg:"), strings.HasPrefix(l, "cpu:"):
			r.header += l + "\n"
		case strings.HasPrefix(l, "Benchmark"):
			r.lines = append(r.lines, l)
		}
	}
	return r, nil
}
