package payments

import (
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store"
)

// BankTransfer is a transfer the simulated bank made.
type BankTransfer struct {
	// Reference is the bank's id of the transfer: "bank_" and 16 random
	// hex digits.
	Reference string `json:"reference"`
	// Amount is what was sent.
	Amount int64 `json:"amount"`
	// To is the account it was sent to.
	To string `json:"to"`
}

// bank is the simulated downstream bank: a separate HTTP service, protected
// by its own idempotency middleware and its own store, that takes delay to
// make each transfer. Its API:
//
//	POST /transfers  Idempotency-Key required; {"amount": n, "to": "..."};
//	                 201 {"reference": "...", "amount": n, "to": "..."}
//	GET  /transfers  200, every transfer the bank made, oldest first
type bank struct {
	delay time.Duration

	mu        sync.Mutex
	transfers []BankTransfer
}

// handler returns the bank's routes on st.
func (b *bank) handler(st store.Store, logger *slog.Logger) (http.Handler, error) {
	idem, err := middleware.New(st,
		// The bank's one client is this service, so all its keys share one
		// scope. A real bank scopes by the client it authenticated.
		middleware.WithScope(scope.Static("payments-service")),
		middleware.WithObserver(middleware.SlogObserver(logger)),
	)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /transfers", idem.Required(middleware.Deadline(b.delay+5*time.Second))(http.HandlerFunc(b.transfer)))
	mux.HandleFunc("GET /transfers", b.list)
	return mux, nil
}

func (b *bank) transfer(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Amount *int64  `json:"amount"`
		To     *string `json:"to"`
	}
	if err := decode(w, r, &in); err != nil {
		badRequest(w, r, err)
		return
	}
	if in.Amount == nil || *in.Amount <= 0 || in.To == nil || !validAccount(*in.To) {
		writeProblem(w, r, http.StatusBadRequest, CodeInvalidRequest, "A transfer needs a positive integer amount and an account to send it to.")
		return
	}
	// The bank's work takes its delay. If the caller gives up first, nothing
	// was done: answer 503, which is not kept, so the key is free again.
	t := time.NewTimer(b.delay)
	select {
	case <-t.C:
	case <-r.Context().Done():
		t.Stop()
		writeProblem(w, r, http.StatusServiceUnavailable, CodeUnavailable, "The transfer was abandoned before it was made.")
		return
	}
	bt := BankTransfer{Reference: newID("bank_"), Amount: *in.Amount, To: *in.To}
	b.mu.Lock()
	b.transfers = append(b.transfers, bt)
	b.mu.Unlock()
	writeJSON(w, http.StatusCreated, bt)
}

func (b *bank) list(w http.ResponseWriter, _ *http.Request) {
	b.mu.Lock()
	all := append(make([]BankTransfer, 0, len(b.transfers)), b.transfers...)
	b.mu.Unlock()
	writeJSON(w, http.StatusOK, all)
}
