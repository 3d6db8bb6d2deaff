package openapi_test

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// oasSchema is the OpenAPI Initiative's schema for OpenAPI 3.1 documents.
const oasSchema = "testdata/oas-3.1-schema-2022-10-07.json"

// validDocument checks that doc is an OpenAPI 3.1 document: it validates
// against the OpenAPI 3.1 schema (formats asserted), every $ref in it
// points into it, every schema in it compiles as a JSON Schema 2020-12
// schema (the dialect of OpenAPI 3.1), and every example validates against
// the schema beside it. It returns the decoded document.
func validDocument(t *testing.T, doc []byte) map[string]any {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	sch, err := c.Compile(oasSchema)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Validate(inst); err != nil {
		t.Fatalf("not a valid OpenAPI 3.1 document: %v\n%s", err, doc)
	}

	var m map[string]any
	if err := json.Unmarshal(doc, &m); err != nil {
		t.Fatal(err)
	}
	walkJSON(m, "", func(path string, v map[string]any) {
		if r, ok := v["$ref"].(string); ok {
			if _, ok := lookup(m, r); !ok {
				t.Errorf("%s: $ref %q points nowhere", path, r)
			}
		}
	})

	// Compile each schema in the document, with the document as its
	// resource so that its references resolve, and check the examples.
	dc := jsonschema.NewCompiler()
	dc.DefaultDraft(jsonschema.Draft2020)
	dc.AssertFormat()
	docInst, _ := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err := dc.AddResource("doc.json", docInst); err != nil {
		t.Fatal(err)
	}
	walkJSON(m, "", func(path string, v map[string]any) {
		if _, ok := v["schema"].(map[string]any); !ok {
			return
		}
		s, err := dc.Compile("doc.json#" + pointer(path+"/schema"))
		if err != nil {
			t.Errorf("%s/schema does not compile: %v", path, err)
			return
		}
		examples, _ := v["examples"].(map[string]any)
		for name, ex := range examples {
			val := ex.(map[string]any)["value"]
			b, _ := json.Marshal(val)
			inst, _ := jsonschema.UnmarshalJSON(bytes.NewReader(b))
			if err := s.Validate(inst); err != nil {
				t.Errorf("%s example %s does not match its schema: %v", path, name, err)
			}
		}
	})
	return m
}

// responseSchema compiles the problem+json schema of the response named in
// components.
func responseSchema(t *testing.T, doc []byte, name string) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource("doc.json", inst); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("doc.json#/components/responses/" + name + "/content/application~1problem+json/schema")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// walkJSON calls f on every object in v with its JSON pointer.
func walkJSON(v any, path string, f func(path string, v map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		f(path, v)
		for k, e := range v {
			walkJSON(e, path+"/"+escape(k), f)
		}
	case []any:
		for i, e := range v {
			walkJSON(e, path+"/"+itoa(i), f)
		}
	}
}

func escape(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

// pointer turns a JSON pointer into a URI fragment.
func pointer(p string) string {
	return strings.NewReplacer("{", "%7B", "}", "%7D", " ", "%20").Replace(p)
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// lookup resolves a local reference ("#/a/b") in doc.
func lookup(doc map[string]any, ref string) (any, bool) {
	p, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, false
	}
	var cur any = doc
	for _, part := range strings.Split(p, "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func TestOASSchemaRefusesBrokenDocuments(t *testing.T) {
	// The validator must be able to fail: these are not OpenAPI 3.1.
	c := jsonschema.NewCompiler()
	sch, err := c.Compile(oasSchema)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{
		`{"openapi":"3.0.3","info":{"title":"t","version":"1"},"paths":{}}`,
		`{"openapi":"3.1.0","paths":{}}`,
		`{"openapi":"3.1.0","info":{"title":"t","version":"1"},"paths":{"/x":{"post":{"parameters":[{"name":"k","in":"body"}]}}}}`,
		`{"openapi":"3.1.0","info":{"title":"t","version":"1"},"paths":{"/x":{"post":{"responses":{"4XXX":{"description":"d"}}}}}}`,
	} {
		inst, err := jsonschema.UnmarshalJSON(strings.NewReader(doc))
		if err != nil {
			t.Fatal(err)
		}
		if sch.Validate(inst) == nil {
			t.Errorf("accepted %s", doc)
		}
	}
	if _, err := os.Stat(oasSchema); err != nil {
		t.Fatal(err)
	}
}
