"""The pykbroker image (docker/Dockerfile) built on the local Debian base and run with host networking."""


def test_engine_and_base_image(docker_client, debian_base_image):
    assert docker_client.ping()
    image = docker_client.images.get(debian_base_image)
    assert image.attrs["Os"] == "linux"
