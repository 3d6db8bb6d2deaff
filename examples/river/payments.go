// Package riverexample shows a side effect done once, after the commit: a
// payment handler that also sends a receipt by e-mail. The e-mail is a
// River job inserted in the request's transaction (River's InsertTx on the
// pgx.Tx that postgres.Tx returns), so it commits with the payment and the
// kept answer, or not at all:
//
//   - a retry of a request that committed is a replay: the handler does
//     not run, and no second job is inserted;
//   - a request that rolls back (a 5xx, a panic, a process killed
//     mid-request) leaves no job behind, and the retry that runs the
//     handler again inserts the one job;
//   - the e-mail goes out when River works the job, which it can only see
//     after the commit.
//
// Sending the e-mail from the handler instead would send it for a payment
// that then rolls back, and again for the retry that runs it again. A job
// made unique by its arguments alone would not help either: it stops a
// second job, not a second payment.
//
// The package is a module of its own, so River and its dependencies never
// reach users of idemkey. River needs its tables (rivermigrate); the tests
// use a schema of their own on the shared PostgreSQL.
package riverexample

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemkey/idemkey/store/postgres"
)

// SchemaSQL creates the payments table in the current schema.
const SchemaSQL = `CREATE TABLE IF NOT EXISTS payments (
	id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	reference text   NOT NULL,
	amount    bigint NOT NULL,
	email     text   NOT NULL
)`

// ReceiptArgs is the job that sends a payment's receipt.
type ReceiptArgs struct {
	PaymentID int64  `json:"payment_id"`
	Reference string `json:"reference"`
	Email     string `json:"email"`
}

// Kind is the job's kind in River's tables.
func (ReceiptArgs) Kind() string { return "payment_receipt" }

// Mailer sends e-mail.
type Mailer interface {
	SendReceipt(ctx context.Context, to string, paymentID int64) error
}

// ReceiptWorker works ReceiptArgs jobs: it sends the receipt. River retries
// a job whose Work fails, so a mailer that can tell a resent message (the
// job's id is a good message id) makes the e-mail exactly-once too.
type ReceiptWorker struct {
	river.WorkerDefaults[ReceiptArgs]
	Mailer Mailer
}

// Work sends one receipt.
func (w *ReceiptWorker) Work(ctx context.Context, job *river.Job[ReceiptArgs]) error {
	return w.Mailer.SendReceipt(ctx, job.Args.Email, job.Args.PaymentID)
}

// Bank charges a payment.
type Bank interface {
	Charge(ctx context.Context, reference string, amount int64) error
}

// Payments is the payment handler.
type Payments struct {
	// Jobs inserts the receipt jobs; it needs no workers of its own.
	Jobs *river.Client[pgx.Tx]
	// Bank charges each payment.
	Bank Bank

	// enqueued, when set, is called after the job is inserted and before
	// the handler answers: the tests stop or kill the process there.
	enqueued func(ctx context.Context)
}

// payment is the body of POST /payments.
type payment struct {
	Reference string `json:"reference"`
	Amount    int64  `json:"amount"`
	Email     string `json:"email"`
}

// ServeHTTP makes one payment and enqueues its receipt, in the request's
// transaction. Put it behind idemkey's middleware on a postgres store.
func (p *Payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx := postgres.Tx(ctx)
	if tx == nil {
		http.Error(w, "no transaction: serve this handler through idemkey on a postgres store", http.StatusInternalServerError)
		return
	}
	var in payment
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Reference == "" || in.Amount <= 0 || in.Email == "" {
		http.Error(w, "want a JSON body with reference, amount > 0 and email", http.StatusBadRequest)
		return
	}
	var id int64
	err := tx.QueryRow(ctx, "INSERT INTO payments (reference, amount, email) VALUES ($1, $2, $3) RETURNING id",
		in.Reference, in.Amount, in.Email).Scan(&id)
	if err != nil {
		http.Error(w, "try again", http.StatusServiceUnavailable) // rolls back
		return
	}
	// The receipt: a job in the same transaction, not an e-mail now.
	if _, err := p.Jobs.InsertTx(ctx, tx, ReceiptArgs{PaymentID: id, Reference: in.Reference, Email: in.Email}, nil); err != nil {
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	if p.enqueued != nil {
		p.enqueued(ctx)
	}
	if err := p.Bank.Charge(ctx, in.Reference, in.Amount); err != nil {
		// A 5xx: the payment and its job roll back, and the key is free
		// for the retry.
		status := http.StatusBadGateway
		if errors.Is(err, context.DeadlineExceeded) {
			status = http.StatusGatewayTimeout
		}
		http.Error(w, "the bank did not answer", status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(map[string]any{"id": id, "reference": in.Reference, "amount": in.Amount})
}
