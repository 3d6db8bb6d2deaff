package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/client"
	"github.com/idemkey/idemkey/middleware"
)

// Service is the payment service: its handlers, its ledger and the
// idempotency middleware its routes use. The two example commands build the
// same Service and differ only in how they route to it.
type Service struct {
	cfg     Config
	backend *Backend
	idem    *middleware.Middleware
	ledger  *ledger
	pays    paymentBook
	bankURL string
	bank    *http.Client
	logger  *slog.Logger
	metrics http.Handler
}

// Metrics serves the idempotency metrics in the Prometheus text format.
func (s *Service) Metrics() http.Handler { return s.metrics }

// Idempotency returns the middleware for the service's routes: Required
// for POST /payments and POST /transfers, Optional for PUT /profile.
func (s *Service) Idempotency() *middleware.Middleware { return s.idem }

// TransferDeadline is the deadline of POST /transfers; see
// Config.TransferDeadline.
func (s *Service) TransferDeadline() time.Duration { return s.cfg.TransferDeadline() }

// CreatePayment is POST /payments: {"amount": <positive integer>,
// "currency": "<3 upper-case letters>"} makes a payment for the caller and
// answers 201 with it and its Location. A bad body is 400 invalid_request,
// which the middleware keeps like any 4xx: a repeat replays the 400.
//
// With DATABASE_URL the payment is inserted through the request's
// transaction (postgres.Tx), which the middleware commits together with
// the kept answer, before the answer goes out. PAYMENT_DELAY waits after
// the payment and before the answer: a process killed meanwhile leaves no
// payment, and the retry runs at once. A payment that cannot be made, or
// whose wait outlives the route's deadline, is answered 503 unavailable
// and undone (rolled back), so the retry makes it.
func (s *Service) CreatePayment(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Amount   *int64  `json:"amount"`
		Currency *string `json:"currency"`
	}
	if err := decode(w, r, &in); err != nil {
		badRequest(w, r, err)
		return
	}
	switch {
	case in.Amount == nil || *in.Amount <= 0:
		badRequest(w, r, errBadRequest(`"amount" must be a positive integer, in the currency's smallest unit.`))
		return
	case in.Currency == nil || !validCurrency(*in.Currency):
		badRequest(w, r, errBadRequest(`"currency" must be three upper-case letters, such as "EUR".`))
		return
	}
	ctx := r.Context()
	p := Payment{ID: newID("pay_"), Amount: *in.Amount, Currency: *in.Currency, User: user(r)}
	undo, err := s.pays.add(ctx, p)
	if err != nil {
		s.logger.Warn("payment failed", "error", err)
		writeProblem(w, r, http.StatusServiceUnavailable, CodeUnavailable, "The payment could not be made; retry with the same idempotency key.")
		return
	}
	if d := s.cfg.PaymentDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			if undo != nil {
				undo()
			}
			writeProblem(w, r, http.StatusServiceUnavailable, CodeUnavailable, "The payment took longer than its deadline and was undone; retry with the same idempotency key.")
			return
		}
	}
	w.Header().Set("Location", "/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

// ListPayments is GET /payments: every payment, oldest first, for every
// user: those this process made, or with DATABASE_URL every payment in the
// database, committed. A replayed request adds nothing here, so the length
// counts how many times CreatePayment ran (and committed).
func (s *Service) ListPayments(w http.ResponseWriter, r *http.Request) {
	ps, err := s.pays.all(r.Context())
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ps)
}

// unavailable answers 503 for a database that failed a read.
func (s *Service) unavailable(w http.ResponseWriter, r *http.Request, err error) {
	s.logger.Warn("reading payments failed", "error", err)
	writeProblem(w, r, http.StatusServiceUnavailable, CodeUnavailable, "The payments could not be read; try again.")
}

// GetPayment is GET /payments/{id}: 200 with the payment, or 404
// not_found. The router sets the path value id (http.ServeMux patterns and
// chi both do).
func (s *Service) GetPayment(w http.ResponseWriter, r *http.Request) {
	p, ok, err := s.pays.get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	if !ok {
		writeProblem(w, r, http.StatusNotFound, CodeNotFound, "There is no payment with this id.")
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// CreateTransfer is POST /transfers: {"amount": <positive integer>, "to":
// "<account>"} asks the bank to send the money and answers 201 with the
// transfer and the bank's reference.
//
// The call to the bank goes through client.Transport with a key derived
// from the incoming one (idemkey.Key.Derive, by the call name
// "bank-transfer"): the transport retries it safely when the bank's answer
// is lost, and when this handler runs again for the same incoming key (a
// retry after a 502 or 504, which the middleware does not keep) the bank
// gets the same key and replays its first answer instead of sending the
// money twice.
func (s *Service) CreateTransfer(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Amount *int64  `json:"amount"`
		To     *string `json:"to"`
	}
	if err := decode(w, r, &in); err != nil {
		badRequest(w, r, err)
		return
	}
	switch {
	case in.Amount == nil || *in.Amount <= 0:
		badRequest(w, r, errBadRequest(`"amount" must be a positive integer, in the currency's smallest unit.`))
		return
	case in.To == nil || !validAccount(*in.To):
		badRequest(w, r, errBadRequest(`"to" must be an account of 1 to 64 visible ASCII characters.`))
		return
	}
	bt, err := s.callBank(r.Context(), *in.Amount, *in.To)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			writeProblem(w, r, http.StatusGatewayTimeout, CodeBankTimeout, "The bank did not answer in time; retry with the same idempotency key.")
			return
		}
		s.logger.Warn("bank call failed", "error", err)
		writeProblem(w, r, http.StatusBadGateway, CodeBankUnavailable, "The bank did not make the transfer; retry with the same idempotency key.")
		return
	}
	t := Transfer{ID: newID("tr_"), Amount: *in.Amount, To: *in.To, User: user(r), BankReference: bt.Reference}
	s.ledger.addTransfer(t)
	writeJSON(w, http.StatusCreated, t)
}

// errBankStatus is a bank answer other than 201.
type errBankStatus int

func (e errBankStatus) Error() string { return "the bank answered " + http.StatusText(int(e)) }

func (s *Service) callBank(ctx context.Context, amount int64, to string) (BankTransfer, error) {
	body, err := json.Marshal(map[string]any{"amount": amount, "to": to})
	if err != nil {
		return BankTransfer{}, err
	}
	ctx = client.WithCallName(ctx, "bank-transfer")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.bankURL+"/transfers", bytes.NewReader(body))
	if err != nil {
		return BankTransfer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.bank.Do(req)
	if err != nil {
		return BankTransfer{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
		return BankTransfer{}, errBankStatus(resp.StatusCode)
	}
	var bt BankTransfer
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&bt); err != nil {
		return BankTransfer{}, err
	}
	return bt, nil
}

// ListTransfers is GET /transfers: every transfer this process made, oldest
// first, for every user.
func (s *Service) ListTransfers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.ledger.allTransfers())
}

// PutProfile is PUT /profile: {"name": "..."} (1 to 100 bytes of UTF-8)
// sets the caller's profile and answers 200 with it. Its key is optional: a
// PUT is idempotent by itself, and a key only makes a repeat answer with
// the first response.
func (s *Service) PutProfile(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Name *string `json:"name"`
	}
	if err := decode(w, r, &in); err != nil {
		badRequest(w, r, err)
		return
	}
	if in.Name == nil || len(*in.Name) == 0 || len(*in.Name) > 100 {
		badRequest(w, r, errBadRequest(`"name" must be 1 to 100 bytes.`))
		return
	}
	p := Profile{User: user(r), Name: *in.Name}
	s.ledger.setProfile(p)
	if d := s.cfg.PaymentDelay; d > 0 {
		// As for payments: a window in which to kill the process with the
		// write made and the answer not sent (a PUT without a key then
		// shows what a gateway does with a mutation it may not resend).
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
	}
	writeJSON(w, http.StatusOK, p)
}

// Healthz is GET /healthz: 200 {"status": "ok", "store": "..."} when the
// idempotency store answers within a second, else 503 unavailable.
func (s *Service) Healthz(w http.ResponseWriter, r *http.Request) {
	if s.backend.Ping != nil {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		err := s.backend.Ping(ctx)
		cancel()
		if err != nil {
			s.logger.Warn("health check: the store does not answer", "store", s.backend.Name, "error", err)
			writeProblem(w, r, http.StatusServiceUnavailable, CodeUnavailable, "The idempotency store does not answer.")
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "store": s.backend.Name})
}

func validCurrency(c string) bool {
	return len(c) == 3 && isUpper(c[0]) && isUpper(c[1]) && isUpper(c[2])
}

func isUpper(c byte) bool { return 'A' <= c && c <= 'Z' }

func validAccount(a string) bool { return visibleASCII(a, 64) }
