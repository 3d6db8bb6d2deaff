package fingerprint_test

import (
	"fmt"
	"net/http/httptest"

	"github.com/idemkey/idemkey/fingerprint"
)

func ExampleCanonicalJSON() {
	out, err := fingerprint.CanonicalJSON(nil, []byte(`{ "b": [1, 1.0], "a": "\u00e9\/", "a": null }`))
	if err != nil {
		panic(err)
	}
	fmt.Println(string(out))
	// Output: {"a":"é/","a":null,"b":[1,1.0]}
}

func ExampleSum() {
	a := fingerprint.Sum("POST", "/orders", "", "application/json", []byte(`{"sku":"A1","qty":2}`))
	b := fingerprint.Sum("POST", "/orders", "", "Application/JSON", []byte(`{ "qty": 2, "sku": "A1" }`))
	c := fingerprint.Sum("POST", "/orders", "", "application/json", []byte(`{"sku":"A1","qty":2.0}`))
	fmt.Println(a == b, a == c)
	// Output: true false
}

func ExampleNew() {
	// A fingerprint of the method and path alone: a retry with another body
	// counts as the same request.
	fp, err := fingerprint.New(fingerprint.Method | fingerprint.Path)
	if err != nil {
		panic(err)
	}
	r := httptest.NewRequest("POST", "/orders?dry_run=1", nil)
	fmt.Println(fp(r, []byte(`{"sku":"A1"}`)) == fp(r, []byte(`{"sku":"B2"}`)))
	// Output: true
}
