from jaxdp.training import dpsgd
