"""The internal wheel index: channels that wheelmill writes on a tree or a bucket (objects,
channels), their pages (pages), served over HTTP (serve) and read there (http_channel),
mirrored to external indexes (remote), and told to consumers (consumer)."""
