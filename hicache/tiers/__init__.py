"""The façade's parts that hold pages: the residency tree (device tier), the host tier and the
storage tier, with the records their ``poll()`` returns and the results the façade hands out."""
