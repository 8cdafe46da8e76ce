# Shortcuts for people; CI runs .ci/run (which runs scripts/test).
.PHONY: test test-fast cluster cluster-down serve images

test:            ## the whole suite: unit, integration, e2e on the local control plane
	scripts/test

test-fast:       ## everything but e2e
	KUBEINFER_SKIP_E2E=1 scripts/test

cluster:         ## start the local control plane; usage: eval "$$(make -s cluster)"
	@e2e/cluster/up

cluster-down:    ## stop it (only the processes it started)
	@e2e/cluster/down

images:          ## build the server and operator images and load them into the local cluster's node
	@scripts/images

serve:           ## serve the bundled example repository on :8000/:8001/:8002
	.venv/bin/kubeinfer-server
