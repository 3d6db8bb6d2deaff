package payments

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
)

// Payment is one payment the service made.
type Payment struct {
	// ID is "pay_" and 16 random hex digits.
	ID string `json:"id"`
	// Amount is positive, in the currency's smallest unit.
	Amount int64 `json:"amount"`
	// Currency is three upper-case letters, such as "EUR".
	Currency string `json:"currency"`
	// User is the caller who made it, or "anonymous".
	User string `json:"user"`
}

// Transfer is one transfer the service made through the bank.
type Transfer struct {
	// ID is "tr_" and 16 random hex digits.
	ID string `json:"id"`
	// Amount is positive, in the currency's smallest unit.
	Amount int64 `json:"amount"`
	// To is the receiving account: 1 to 64 visible ASCII characters.
	To string `json:"to"`
	// User is the caller who made it, or "anonymous".
	User string `json:"user"`
	// BankReference is the bank's reference of the transfer: the same on
	// every answer for one transfer, however often the bank was asked.
	BankReference string `json:"bank_reference"`
}

// Profile is a caller's profile.
type Profile struct {
	// User is the caller whose profile it is, or "anonymous".
	User string `json:"user"`
	// Name is 1 to 100 bytes.
	Name string `json:"name"`
}

// paymentBook is where payments are made: the ledger in this process's
// memory, or the payments table of the database (DATABASE_URL).
type paymentBook interface {
	// add makes payment p as part of the request whose context is ctx,
	// and returns how to undo it when the request fails after all (nil
	// when the request's transaction takes care of that).
	add(ctx context.Context, p Payment) (undo func(), err error)
	// all returns every payment, oldest first; never nil.
	all(ctx context.Context) ([]Payment, error)
	// get returns the payment with id, and whether there is one.
	get(ctx context.Context, id string) (Payment, bool, error)
}

// ledger is what this process has done, in order. It lives in memory: a
// second instance has its own, which is what lets a test count how many
// times each instance ran a handler.
type ledger struct {
	mu        sync.Mutex
	payments  []Payment
	byID      map[string]int
	transfers []Transfer
	profiles  map[string]Profile
}

func newLedger() *ledger {
	return &ledger{byID: map[string]int{}, profiles: map[string]Profile{}}
}

// memoryPayments is the paymentBook of a service without a database.
type memoryPayments struct{ *ledger }

func (l memoryPayments) add(_ context.Context, p Payment) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byID[p.ID] = len(l.payments)
	l.payments = append(l.payments, p)
	return func() { l.remove(p.ID) }, nil
}

// remove undoes the payment with id.
func (l memoryPayments) remove(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, ok := l.byID[id]
	if !ok {
		return
	}
	l.payments = append(l.payments[:i], l.payments[i+1:]...)
	delete(l.byID, id)
	for j := i; j < len(l.payments); j++ {
		l.byID[l.payments[j].ID] = j
	}
}

func (l memoryPayments) get(_ context.Context, id string) (Payment, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, ok := l.byID[id]
	if !ok {
		return Payment{}, false, nil
	}
	return l.payments[i], true, nil
}

// all returns every payment, oldest first; never nil, so that it encodes
// as [] when there are none.
func (l memoryPayments) all(context.Context) ([]Payment, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append(make([]Payment, 0, len(l.payments)), l.payments...), nil
}

func (l *ledger) addTransfer(t Transfer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.transfers = append(l.transfers, t)
}

func (l *ledger) allTransfers() []Transfer {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append(make([]Transfer, 0, len(l.transfers)), l.transfers...)
}

func (l *ledger) setProfile(p Profile) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.profiles[p.User] = p
}

// newID returns prefix and 16 random hex digits.
func newID(prefix string) string {
	var b [8]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
