import tritonclient.http as httpclient
import numpy as np

def test_smoke(server, assert_still_serving):
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_server_live()
    assert client.is_server_ready()
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    r = client.infer("simple", inputs)
    assert (r.as_numpy("OUTPUT0") == 2 * a).all()
