// Hand-written in the shape sqlc generates (see db.go).

package sqlcdb

// Payment is a row of the payments table.
type Payment struct {
	ID      string
	IdemKey string
	Amount  int64
	MadeBy  string
}
