package payments

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// maxBody bounds the body a handler reads. The idempotency middleware has
// its own limit (1 MiB) on the routes it covers; this one also covers a
// PUT /profile sent without a key.
const maxBody = 64 << 10

// errBadRequest is a 400 whose message is safe to send: it names the
// field at fault and never echoes the body.
type errBadRequest string

func (e errBadRequest) Error() string { return string(e) }

// decode reads r's body as exactly one JSON object into v. Unknown fields
// are ignored. Its errors are errBadRequest.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	if err := dec.Decode(v); err != nil {
		var (
			typeErr *json.UnmarshalTypeError
			sizeErr *http.MaxBytesError
		)
		switch {
		case errors.As(err, &sizeErr):
			return errBadRequest(fmt.Sprintf("The body is larger than %d bytes.", maxBody))
		case errors.As(err, &typeErr) && typeErr.Field != "":
			return errBadRequest(fmt.Sprintf("The field %q has the wrong type.", typeErr.Field))
		case errors.Is(err, io.EOF):
			return errBadRequest("The body is empty; send a JSON object.")
		default:
			return errBadRequest("The body is not a JSON object.")
		}
	}
	if _, err := dec.Token(); err != io.EOF {
		return errBadRequest("The body holds more than one JSON value.")
	}
	return nil
}

// badRequest answers 400 invalid_request with err's message when err is an
// errBadRequest, and a generic message otherwise.
func badRequest(w http.ResponseWriter, r *http.Request, err error) {
	detail := "The request is not valid."
	if e, ok := errors.AsType[errBadRequest](err); ok {
		detail = string(e)
	}
	writeProblem(w, r, http.StatusBadRequest, CodeInvalidRequest, detail)
}

// writeJSON answers status with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
