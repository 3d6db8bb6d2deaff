package main

import (
	"bufio"
	"context"
	"fmt"
	"strings"
)

// deleted is what delete prints with --json.
type deleted struct {
	*entry
	Deleted bool `json:"deleted"`
	// Reason says why nothing was deleted: "not_found", "declined" or
	// "changed".
	Reason string `json:"reason,omitempty"`
}

func del(ctx context.Context, e *env, args []string) error {
	fs := commandFlags(e, "delete", "--scope S --key K | --digest HEX [--yes]")
	keyOf := keyFlags(fs)
	yes := fs.Bool("yes", false, "delete without asking")
	ctx, err := parseFlags(ctx, e, fs, args)
	if err != nil {
		return err
	}
	key, err := keyOf()
	if err != nil {
		return err
	}
	ent, err := e.fetch(ctx, key, false)
	if err != nil {
		return err
	}
	out := deleted{entry: ent}
	finish := func(msg string) error {
		if e.json {
			if err := e.printJSON(out); err != nil {
				return err
			}
		} else {
			fmt.Fprintln(e.stdout, msg)
		}
		if out.Deleted {
			return nil
		}
		return errNotDone
	}
	if !ent.Found {
		out.Reason = "not_found"
		return finish("nothing to delete: " + ent.Key + " is not in the store")
	}

	if !*yes {
		// The question and what it is about go to stderr, so that stdout
		// carries only the outcome (JSON with --json).
		prompt := *e
		prompt.stdout = e.stderr
		prompt.printEntry(ent)
		fmt.Fprintf(e.stderr, "\n%s\nDelete %s? [y/N] ", consequence(ent.State), ent.Key)
		line, _ := bufio.NewReader(e.stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			out.Reason = "declined"
			return finish("not deleted")
		}
	}
	gone, err := e.st.Delete(ctx, key, ent.seen)
	if err != nil {
		return err
	}
	if !gone {
		out.Reason = "changed"
		return finish("not deleted: the key changed since it was read (run the command again to see it now)")
	}
	out.Deleted = true
	return finish("deleted " + ent.Key)
}

// consequence says what deleting a key in state means for the service.
func consequence(state string) string {
	switch state {
	case "completed":
		return "A retry with this key will run the handler again (instances with a local replay cache replay it until their entries lapse)."
	case "in_flight":
		return "The request holding this key may still be running: a retry with this key will run the handler at the same time."
	}
	return "idemkey cannot read this value; it may have been written by a later version."
}
