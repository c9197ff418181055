# The Argo Rollouts Gateway API traffic-router plugin, packed into an image of the stack's
# mirror so the controller never downloads it from GitHub. ADD checks the binary against
# the sha256 recorded when it was mirrored (`dsvolc images <stack>`); runtime/build.sh
# passes the base (busybox, for `cp` in the init container) by digest.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG PLUGIN_URL
ARG PLUGIN_SHA256
ADD --checksum=sha256:${PLUGIN_SHA256} --chmod=0555 ${PLUGIN_URL} /plugin/gatewayapi-plugin
USER 65534
