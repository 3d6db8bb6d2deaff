package pgtest

import (
	"bufio"
	"context"
	"crypto/md5"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os/user"
	"strconv"
	"strings"
)

// connInfo is what the harness reads of a postgres:// URL.
type connInfo struct {
	Host     string
	Port     int
	User     string
	Password string
	Database string // "" for the server's default (the user's name)
}

// parseURL reads a postgres:// (or postgresql://) URL: the host defaults to
// localhost, the port to 5432, the user to the process's.
func parseURL(s string) (connInfo, error) {
	u, err := url.Parse(s)
	if err != nil {
		return connInfo{}, err
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return connInfo{}, fmt.Errorf("pgtest: %q is not a postgres:// URL", u.Redacted())
	}
	ci := connInfo{Host: u.Hostname(), Port: 5432, Database: strings.TrimPrefix(u.Path, "/")}
	if ci.Host == "" {
		ci.Host = "localhost"
	}
	if p := u.Port(); p != "" {
		if ci.Port, err = strconv.Atoi(p); err != nil {
			return connInfo{}, fmt.Errorf("pgtest: port %q: %v", p, err)
		}
	}
	if u.User != nil {
		ci.User = u.User.Username()
		ci.Password, _ = u.User.Password()
	}
	if ci.User == "" {
		if me, err := user.Current(); err == nil {
			ci.User = me.Username
		}
	}
	return ci, nil
}

// ping connects to the server at rawURL over the wire protocol (without
// TLS), signs in (trust, a cleartext or an MD5 password) and runs SELECT 1
// with the simple protocol, which leaves no statement behind on a
// pooler's server connection. A server that asks for SCRAM is taken as
// answering: it spoke the protocol, and the tests' drivers sign in
// themselves.
func ping(ctx context.Context, rawURL string) error {
	ci, err := parseURL(rawURL)
	if err != nil {
		return err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ci.Host, strconv.Itoa(ci.Port)))
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	w := bufio.NewWriter(conn)
	r := bufio.NewReader(conn)
	var startup []byte
	startup = binary.BigEndian.AppendUint32(startup, 196608) // protocol 3.0
	for _, kv := range [][2]string{{"user", ci.User}, {"database", ci.Database}} {
		if kv[1] != "" {
			startup = append(append(append(append(startup, kv[0]...), 0), kv[1]...), 0)
		}
	}
	startup = append(startup, 0)
	writeMsg(w, 0, startup)
	if err := w.Flush(); err != nil {
		return err
	}
	queried := false
	for {
		typ, body, err := readMsg(r)
		if err != nil {
			return err
		}
		switch typ {
		case 'R':
			if len(body) < 4 {
				return errors.New("pgtest: short authentication message")
			}
			switch code := binary.BigEndian.Uint32(body); code {
			case 0: // AuthenticationOk
			case 3: // cleartext password
				writeMsg(w, 'p', append([]byte(ci.Password), 0))
			case 5: // MD5: "md5" + md5(md5(password + user) + salt)
				if len(body) < 8 {
					return errors.New("pgtest: short MD5 request")
				}
				inner := md5.Sum([]byte(ci.Password + ci.User))
				outer := md5.Sum(append([]byte(hex.EncodeToString(inner[:])), body[4:8]...))
				writeMsg(w, 'p', append([]byte("md5"+hex.EncodeToString(outer[:])), 0))
			case 10: // SASL
				return nil
			default:
				return fmt.Errorf("pgtest: authentication method %d not supported", code)
			}
			if err := w.Flush(); err != nil {
				return err
			}
		case 'E':
			return fmt.Errorf("pgtest: server error: %s", errorMessage(body))
		case 'Z': // ReadyForQuery
			if queried {
				writeMsg(w, 'X', nil)
				w.Flush()
				return nil
			}
			writeMsg(w, 'Q', []byte("SELECT 1\x00"))
			if err := w.Flush(); err != nil {
				return err
			}
			queried = true
		}
	}
}

// writeMsg writes one message: its type byte (none for the startup
// message), its length and its body.
func writeMsg(w *bufio.Writer, typ byte, body []byte) {
	if typ != 0 {
		w.WriteByte(typ)
	}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(body)+4))
	w.Write(n[:])
	w.Write(body)
}

// readMsg reads one message from the server.
func readMsg(r *bufio.Reader) (byte, []byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n < 4 || n > 1<<24 {
		return 0, nil, fmt.Errorf("pgtest: message %q of length %d", head[0], n)
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return head[0], body, nil
}

// errorMessage returns the severity, code and message of an
// ErrorResponse's fields.
func errorMessage(body []byte) string {
	var sev, code, msg string
	for len(body) > 1 {
		field := body[0]
		end := strings.IndexByte(string(body[1:]), 0)
		if end < 0 {
			break
		}
		v := string(body[1 : 1+end])
		body = body[2+end:]
		switch field {
		case 'S':
			sev = v
		case 'C':
			code = v
		case 'M':
			msg = v
		}
	}
	return fmt.Sprintf("%s: %s (SQLSTATE %s)", sev, msg, code)
}
