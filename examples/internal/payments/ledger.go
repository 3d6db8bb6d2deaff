package payments

import (
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

func (l *ledger) addPayment(p Payment) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byID[p.ID] = len(l.payments)
	l.payments = append(l.payments, p)
}

func (l *ledger) payment(id string) (Payment, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, ok := l.byID[id]
	if !ok {
		return Payment{}, false
	}
	return l.payments[i], true
}

// allPayments returns every payment, oldest first; never nil, so that it
// encodes as [] when there are none.
func (l *ledger) allPayments() []Payment {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append(make([]Payment, 0, len(l.payments)), l.payments...)
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
