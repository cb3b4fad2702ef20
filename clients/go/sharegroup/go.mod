module github.com/kafka-delay/kafka-delay/clients/go/sharegroup

go 1.26.0

require (
	github.com/kafka-delay/kafka-delay/clients/go v0.0.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kadm v1.20.0
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
)

require (
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
)

replace github.com/kafka-delay/kafka-delay/clients/go => ../
