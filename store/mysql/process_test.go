package mysql_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
)

// The environment of the child process TestHelperProcess runs as.
const (
	childEnv      = "IDEMKEY_MYSQL_CHILD"
	childTableEnv = "IDEMKEY_MYSQL_CHILD_TABLE"
	childPayEnv   = "IDEMKEY_MYSQL_CHILD_PAY"
	childKeyEnv   = "IDEMKEY_MYSQL_CHILD_KEY"
)

// TestHelperProcess is not a test: it is the child process other tests
// start (the test binary run again), which claims a key in a transaction,
// writes a payment through it, says "claimed" on its standard output, and
// blocks until it is killed.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("the child process of the crash tests")
	}
	db := sharedDB(t)
	st, err := mysql.New(context.Background(), db, mysql.WithTable(os.Getenv(childTableEnv)), mysql.WithSweepInterval(0))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	key := os.Getenv(childKeyEnv)
	res, tx, err := st.ClaimTx(context.Background(), key, store.Claim{Token: "child", Fingerprint: [32]byte{9}, TTL: time.Hour})
	if err != nil || res.State != store.Claimed {
		fmt.Println("error: claim:", res.State, err)
		os.Exit(2)
	}
	ctx := tx.NewContext(context.Background())
	if _, err := mysql.Tx(ctx).ExecContext(ctx, "INSERT INTO `"+os.Getenv(childPayEnv)+"` (k, made_by) VALUES (?, 'child')", key); err != nil {
		fmt.Println("error: insert:", err)
		os.Exit(2)
	}
	fmt.Println("claimed")
	select {}
}

// startChild starts the child process on key and waits until it has
// claimed the key and written its payment.
func startChild(t *testing.T, table string, pay payments, key string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childTableEnv+"="+table, childPayEnv+"="+pay.name, childKeyEnv+"="+key)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); l == "claimed" || strings.HasPrefix(l, "error") {
				lines <- l
				return
			}
		}
		lines <- "no answer"
	}()
	select {
	case l := <-lines:
		if l != "claimed" {
			t.Fatalf("the child process: %s", l)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the child process did not claim within 30 s")
	}
	return cmd
}

// TestCrashKilledOwnerIsTakenOver: a process that claimed a key and wrote
// in its transaction is killed (SIGKILL); its sessions end with its
// connections, and another claims the key at once, without the dead
// owner's payment. Five rounds; the time from the kill to the new claim
// is reported.
func TestCrashKilledOwnerIsTakenOver(t *testing.T) {
	db := sharedDB(t)
	st, table := newStore(t, db)
	pay := newPayments(t, db)
	var took []time.Duration
	for round := range 5 {
		key := newKey()
		child := startChild(t, table, pay, key)
		res, tx, err := st.ClaimTx(context.Background(), key, newClaim(9))
		if err != nil || res.State != store.InFlight || tx != nil {
			t.Fatalf("round %d: ClaimTx while the child holds the key: %v %v, want in flight", round, res.State, err)
		}
		if err := child.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		tx, _ = untilClaimed(t, st, key, newClaim(9), 10*time.Second)
		took = append(took, time.Since(start))
		child.Wait()
		if n := pay.count(t, key); n != 0 {
			t.Fatalf("round %d: %d payments of the killed child, want 0", round, n)
		}
		if err := tx.Commit(context.Background(), record([32]byte{9}, 201), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(took)
	t.Logf("from SIGKILL of the owner's process to the next claim: median %v, max %v (%v)", took[len(took)/2], took[len(took)-1], took)
}
