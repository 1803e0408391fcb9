"""The launcher's code: placement plan, Ray cluster, role hosting, supervision, warm start.

``launch.py`` drives it; it may import the roles, since it starts them. No role imports it
(``tests/test_layers.py``): a role's node needs none of it but ``roles.RoleHost``, which Ray
unpickles there by name.
"""
