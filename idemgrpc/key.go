package idemgrpc

import (
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// keyFields finds, per message type, the first of a list of field names
// that the type has as a top-level singular string field: the field a key
// is read from. What it found is kept per type, so each type is looked at
// once.
type keyFields struct {
	names []string
	found sync.Map // protoreflect.FullName -> protoreflect.FieldDescriptor (nil: none)
}

func newKeyFields(names []string) *keyFields {
	return &keyFields{names: names}
}

// field returns the key field of m's type, or nil.
func (k *keyFields) field(m protoreflect.Message) protoreflect.FieldDescriptor {
	if len(k.names) == 0 {
		return nil
	}
	d := m.Descriptor()
	if f, ok := k.found.Load(d.FullName()); ok {
		fd, _ := f.(protoreflect.FieldDescriptor)
		return fd
	}
	var fd protoreflect.FieldDescriptor
	for _, n := range k.names {
		f := d.Fields().ByName(protoreflect.Name(n))
		if f != nil && f.Kind() == protoreflect.StringKind && f.Cardinality() != protoreflect.Repeated && !f.IsMap() {
			fd = f
			break
		}
	}
	if fd == nil {
		k.found.Store(d.FullName(), nil)
	} else {
		k.found.Store(d.FullName(), fd)
	}
	return fd
}

// read returns the key the request message req carries in its key field,
// and the field; "" and nil when it has none or the field is empty.
func (k *keyFields) read(req any) (string, protoreflect.FieldDescriptor) {
	m, ok := req.(proto.Message)
	if !ok {
		return "", nil
	}
	r := m.ProtoReflect()
	fd := k.field(r)
	if fd == nil {
		return "", nil
	}
	v := r.Get(fd).String()
	if v == "" {
		return "", nil
	}
	return v, fd
}
