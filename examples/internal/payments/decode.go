package payments

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
)

// maxBody bounds the body a handler reads. The idempotency middleware has
// its own limit (1 MiB) on the routes it covers; this one also covers a
// PUT /profile sent without a key.
const maxBody = 64 << 10

// errBadRequest is a 400 whose message is safe to send: it names the
// field at fault and never echoes the body.
type errBadRequest string

func (e errBadRequest) Error() string { return string(e) }

// errMediaType is the answer to a body that is not labelled JSON: 415.
// Bodies are read as what their label says, the way the idempotency
// middleware's fingerprint reads them; a service that decoded JSON from a
// form-labelled body would let two requests that differ to it look alike
// to anyone reading them by their label.
var errMediaType = errors.New("the body is not labelled application/json")

// decode reads r's body as exactly one JSON object into v, and only when
// its Content-Type is application/json (or a +json type): otherwise
// errMediaType (an empty body without a label is just empty). Unknown fields are ignored. Its other errors are
// errBadRequest.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" || r.ContentLength != 0 {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return errMediaType
		}
	}
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

// badRequest answers 415 unsupported_media_type for errMediaType, and 400
// invalid_request with err's message when err is an errBadRequest, and a
// generic message otherwise.
func badRequest(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errMediaType) {
		writeProblem(w, r, http.StatusUnsupportedMediaType, CodeUnsupportedMediaType,
			`Send the body as JSON, with "Content-Type: application/json".`)
		return
	}
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
