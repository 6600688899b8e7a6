module safetensors.invalid/cgo

go 1.21
