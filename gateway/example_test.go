package gateway_test

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/gateway"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// Two instances of a payment service share one store behind the gateway.
// The first instance makes the payment and dies before its reply leaves;
// the gateway sends the same key and body to the second, which replays
// the first one's answer.
func Example() {
	st, err := memory.New()
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	idem, err := middleware.New(st)
	if err != nil {
		log.Fatal(err)
	}
	var payments atomic.Int32
	instance := func(name string, dies bool) *httptest.Server {
		srv := httptest.NewUnstartedServer(idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := payments.Add(1)
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "payment %d by %s\n", n, name)
		})))
		if dies {
			srv.Listener = dyingListener{srv.Listener}
		}
		srv.Start()
		return srv
	}
	a, b := instance("a", true), instance("b", false)
	defer a.Close()
	defer b.Close()

	gw, err := gateway.New([]string{a.URL, b.URL})
	if err != nil {
		log.Fatal(err)
	}
	front := httptest.NewServer(gw.ReverseProxy())
	defer front.Close()

	req, _ := http.NewRequest(http.MethodPost, front.URL+"/payments", strings.NewReader(`{"amount":10}`))
	req.Header.Set(idemkey.Header, "order-42")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Print(resp.StatusCode, " replayed=", resp.Header.Get(idemkey.HeaderReplayed), " ", string(body))
	fmt.Println("payments made:", payments.Load())
	// Output:
	// 201 replayed=true payment 1 by a
	// payments made: 1
}

// dyingListener's connections close instead of writing a reply.
type dyingListener struct{ net.Listener }

func (l dyingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	return dyingConn{c}, err
}

type dyingConn struct{ net.Conn }

func (c dyingConn) Write([]byte) (int, error) {
	c.Conn.Close()
	return 0, net.ErrClosed
}
