package postgres

import (
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestStatementsNameTheTable: every statement names the table where it
// had T, and no T is left.
func TestStatementsNameTheTable(t *testing.T) {
	st := newStatements(pgx.Identifier{"app", "idem"})
	v := reflect.ValueOf(st)
	for i := range v.NumField() {
		sql := v.Field(i).String()
		name := v.Type().Field(i).Name
		want := `"app"."idem"`
		if name == "claimCall" {
			want = `"app"."idem_claim"(`
		}
		if !strings.Contains(sql, want) {
			t.Errorf("%s does not name the table:\n%s", name, sql)
		}
		if tableWord.MatchString(sql) {
			t.Errorf("%s still holds T:\n%s", name, sql)
		}
	}
}
