-- The payments table the queries run on (PostgreSQL). The tests create it
-- in a schema of their own.
CREATE TABLE payments (
	id       text PRIMARY KEY,
	idem_key text NOT NULL,
	amount   bigint NOT NULL,
	made_by  text NOT NULL
);
