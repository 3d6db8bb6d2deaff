package postgres_test

import (
	"testing"
)

// TestThroughPgBouncer runs the fault table, the exactly-once tests and
// the crash tests again through a transaction-mode PgBouncer of each
// test's own (pool_size 20, pgx in exec mode), which hands server
// connections from client to client between transactions: what holds for
// a direct connection must hold there too. Each subtest checks on the
// server behind the pooler, when it ends, that no session advisory lock
// is left.
func TestThroughPgBouncer(t *testing.T) {
	for _, c := range []struct {
		name string
		test func(*testing.T)
	}{
		{"Conformance", TestConformance},
		{"OneKey64", TestMiddlewareOneKey64},
		{"RollsBack", TestMiddlewareRollsBack},
		{"TerminatedBackend", TestMiddlewareTerminatedBackend},
		{"Lapse", TestMiddlewareLapse},
		{"Flush", TestMiddlewareFlush},
		{"TwoProcesses", TestMiddlewareTwoProcesses},
		{"Crash", TestMiddlewareCrash},
		{"DatabaseDown", TestMiddlewareDatabaseDown},
		{"LostCommitReply", TestMiddlewareLostCommitReply},
		{"CrashKilledOwnerIsTakenOver", TestCrashKilledOwnerIsTakenOver},
		{"TwoProcessesRunEachKeyOnce", TestTwoProcessesRunEachKeyOnce},
		{"FaultDatabaseDown", TestFaultDatabaseDown},
		{"FaultDatabaseFrozen", TestFaultDatabaseFrozen},
		{"FaultPoolExhausted", TestFaultPoolExhausted},
		{"TxCommitKeepsRecordAndWrites", TestTxCommitKeepsRecordAndWrites},
		{"TxTerminatedOwnerIsTakenOver", TestTxTerminatedOwnerIsTakenOver},
		{"TxOwnerGone", TestTxOwnerGone},
		{"TxLapsedOwnerIsFenced", TestTxLapsedOwnerIsFenced},
		{"TxLateCommitNeverLands", TestTxLateCommitNeverLands},
		{"TxLateCommitAfterTheServerEndedIt", TestTxLateCommitAfterTheServerEndedIt},
		{"TxCommitRefused", TestTxCommitRefused},
		{"EveryIsolationLevel", TestEveryIsolationLevelRunsAKeyOnce},
		{"KeptClientErrorUndoesWrites", TestKeptClientErrorUndoesWrites},
		{"KeylessRequest", TestKeylessRequestRunsInATransaction},
		{"WaitWakes", TestWaitWakesWhenTheOwnerEnds},
		{"MiddlewareWaitReplays", TestMiddlewareWaitReplays},
		{"NoSubtransaction", TestNoSubtransaction},
		{"SessionChangedByHandler", TestSessionChangedByHandler},
		{"SessionSearchPath", TestSessionSearchPath},
		{"Kept4xxRace", TestKept4xxRace},
		{"CommitHeldThenDropped", TestCommitHeldThenDropped},
		{"PoolOfOne", TestPoolOfOne},
		// The database/sql face.
		{"SQLTxConformance", TestSQLTxConformance},
		{"SQLMiddlewareOneKey64", TestSQLMiddlewareOneKey64},
		{"SQLMiddlewareHandlerEndsTx", TestSQLMiddlewareHandlerEndsTx},
		{"SQLMiddlewareCrash", TestSQLMiddlewareCrash},
		{"SQLFaultDatabaseDown", TestSQLFaultDatabaseDown},
		{"SQLFaultPoolExhausted", TestSQLFaultPoolExhausted},
	} {
		t.Run(c.name, c.test)
	}
}
